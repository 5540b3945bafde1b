package attest

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// LoadOrCreateKey returns the host's ed25519 key kept at path as its
// 32-byte seed, creating it (mode 0600, durably) when absent. A file of
// another size or mode wider than 0600 is refused rather than trusted.
func LoadOrCreateKey(path string) (ed25519.PrivateKey, error) {
	key, err := loadKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, err
	}
	// Whole and durable, and only if absent: a crash leaves either no key
	// or a whole one, never a short file that would be refused, and a key
	// another process created meanwhile is never replaced.
	err = createSeed(path, seed)
	if errors.Is(err, fs.ErrExist) {
		// Another process won the race: its key. (Loaded, not created
		// again: a name that exists but does not open, a dangling link,
		// is an error, not a loop.)
		return loadKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("attest: host key: %w", err)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// loadKey reads the key at path; an absent one is an error wrapping
// fs.ErrNotExist.
func loadKey(path string) (ed25519.PrivateKey, error) {
	seed, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("attest: host key: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("attest: host key %s has mode %v: must not be readable by group or others", path, st.Mode().Perm())
	}
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("attest: host key %s: %d bytes, want %d", path, len(seed), ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// createSeed writes seed to path whole and durably if nothing is there:
// to a temporary file beside it (mode 0600, fsynced), linked to path (a
// name already there, even one another process made meanwhile, is left
// and reported as fs.ErrExist), then the directory fsynced so the name
// survives a crash. It is internal/atomicfile's Create, which says why
// each sync, written out here so that this public package stands alone.
func createSeed(path string, seed []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".host-key.tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // the link is the file once made
	_, err = f.Write(seed)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
