package store

import (
	"errors"
	"fmt"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Errors of the trusted keys.
var (
	// ErrNotTrusted is an [Store.Untrust] of a key that is not trusted.
	ErrNotTrusted = errors.New("host key not trusted")
	// ErrKeyName is a key's name that is not UTF-8 or is too long.
	ErrKeyName = errors.New("malformed key name")
)

// TrustedKey is a host key this store's daemon trusts: its id (the BLAKE3
// of the ed25519 public key, attest.KeyID) and the name it was given.
type TrustedKey struct {
	Key  record.Address
	Name string
}

// maxTrustName bounds a trusted key's name.
const maxTrustName = 256

// Trust records key as trusted under name (replacing an earlier name).
func (s *Store) Trust(key record.Address, name string) error {
	if len(name) > maxTrustName || !utf8.ValidString(name) {
		return fmt.Errorf("%w: a key's name is UTF-8 of at most %d bytes", ErrKeyName, maxTrustName)
	}
	return s.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bktTrust).Put(key[:], []byte(name))
	})
}

// Untrust forgets key; [ErrNotTrusted] when it was not trusted.
func (s *Store) Untrust(key record.Address) error {
	return s.commit(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktTrust)
		if b.Get(key[:]) == nil {
			return refuse(fmt.Errorf("key %s: %w", key, ErrNotTrusted))
		}
		return b.Delete(key[:])
	})
}

// TrustedKeys lists the trusted keys, ordered by key id.
func (s *Store) TrustedKeys() ([]TrustedKey, error) {
	var out []TrustedKey
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktTrust).ForEach(func(k, v []byte) error {
			if len(k) != len(record.Address{}) {
				return fmt.Errorf("%w: trusted key of %d bytes", ErrDamaged, len(k))
			}
			out = append(out, TrustedKey{Key: record.Address(k), Name: string(v)})
			return nil
		})
	})
	return out, err
}

// IsTrusted reports whether key is trusted.
func (s *Store) IsTrusted(key record.Address) bool {
	ok := false
	_ = s.view(func(tx *bolt.Tx) error {
		ok = tx.Bucket(bktTrust).Get(key[:]) != nil
		return nil
	})
	return ok
}

// migrateTrust (2 → 3) creates the trusted host keys' bucket, empty.
func migrateTrust(tx *bolt.Tx) error {
	_, err := tx.CreateBucket(bktTrust)
	return err
}
