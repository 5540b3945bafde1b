package attest

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
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
	err = atomicfile.Create(path, 0o600, func(f *os.File) error {
		_, err := f.Write(seed)
		return err
	})
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
