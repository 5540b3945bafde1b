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
	seed, err := os.ReadFile(path)
	if err == nil {
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
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("attest: host key: %w", err)
	}
	seed = make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, err
	}
	// Temp file, fsync, rename, fsync the directory: a crash leaves either
	// no key or a whole one, never a short file that would be refused.
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".hostkey-*")
	if err != nil {
		return nil, fmt.Errorf("attest: host key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, err
	}
	if _, err := tmp.Write(seed); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) { // another process won the race
			return LoadOrCreateKey(path)
		}
		return nil, fmt.Errorf("attest: host key: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return nil, err
	}
	return ed25519.NewKeyFromSeed(seed), nil
}
