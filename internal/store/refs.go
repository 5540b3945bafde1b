package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// addRefs records that a refers to refs, as the union with what a already
// declared. It commits only if that adds something.
func (s *Store) addRefs(a record.Address, refs []record.Address) error {
	if len(refs) == 0 {
		return nil
	}
	old, err := s.Refs(a)
	if err != nil {
		return err
	}
	merged := appendNew(old, refs)
	if len(merged) == len(old) {
		return nil
	}
	v := make([]byte, 0, 32*len(merged))
	for _, r := range merged {
		v = append(v, r[:]...)
	}
	return s.commit(func(tx *bolt.Tx) error { return tx.Bucket(bktRefs).Put(a[:], v) })
}

// appendNew appends to dst each address of add not already in it.
func appendNew(dst, add []record.Address) []record.Address {
	seen := make(map[record.Address]bool, len(dst)+len(add))
	for _, a := range dst {
		seen[a] = true
	}
	for _, a := range add {
		if !seen[a] {
			seen[a] = true
			dst = append(dst, a)
		}
	}
	return dst
}

// Refs returns the objects a declared, when it was put, that it refers to.
func (s *Store) Refs(a record.Address) ([]record.Address, error) {
	var out []record.Address
	err := s.view(func(tx *bolt.Tx) error {
		var err error
		out, err = getRefs(tx, a)
		return err
	})
	return out, err
}

func getRefs(tx *bolt.Tx, a record.Address) ([]record.Address, error) {
	v := tx.Bucket(bktRefs).Get(a[:])
	if len(v)%32 != 0 {
		return nil, fmt.Errorf("store: %w: refs of %s are %d bytes", ErrDamaged, a, len(v))
	}
	out := make([]record.Address, 0, len(v)/32)
	for i := 0; i < len(v); i += 32 {
		out = append(out, record.Address(v[i:i+32]))
	}
	return out, nil
}
