package store

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// GCStats reports a collection.
type GCStats struct {
	Kept, Removed           int
	KeptBytes, RemovedBytes int64
}

// reachable returns every object reachable from the records: the objects
// segments name, and transitively the objects those declared as refs
// (an attestation's receipt and journal, a directory's files).
func (s *Store) reachable() (map[record.Address]bool, error) {
	ids, err := s.AllRuns()
	if err != nil {
		return nil, err
	}
	seen := map[record.Address]bool{}
	var stack []record.Address
	for _, id := range ids {
		st, err := s.Load(id)
		if err != nil {
			return nil, err
		}
		for i := range st.Segments {
			for _, a := range segmentRefs(&st.Segments[i]) {
				if !seen[a] {
					seen[a] = true
					stack = append(stack, a)
				}
			}
		}
	}
	for len(stack) > 0 {
		a := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		refs, err := s.Refs(a)
		if err != nil {
			return nil, err
		}
		for _, r := range refs {
			if !seen[r] {
				seen[r] = true
				stack = append(stack, r)
			}
		}
	}
	return seen, nil
}

// GC removes every object no record reaches, except those younger than
// grace (an object is written before the segment naming it, so a young
// unreferenced object may be about to be named). It reports what it
// removed and kept.
func (s *Store) GC(grace time.Duration) (GCStats, error) {
	live, err := s.reachable()
	if err != nil {
		return GCStats{}, err
	}
	var st GCStats
	cutoff := time.Now().Add(-grace)
	err = s.walkObjects(func(a record.Address, p string, info os.FileInfo) error {
		if live[a] || info.ModTime().After(cutoff) {
			st.Kept++
			st.KeptBytes += info.Size()
			return nil
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("store: gc: %w", err)
		}
		s.dropRefs(a)
		st.Removed++
		st.RemovedBytes += info.Size()
		return nil
	})
	return st, err
}

func (s *Store) dropRefs(a record.Address) {
	s.commit(func(tx *bolt.Tx) error { return tx.Bucket(bktRefs).Delete(a[:]) })
}

// walkObjects calls fn for every object file. A file whose name is not an
// address is an error: nothing but objects lives there.
func (s *Store) walkObjects(fn func(a record.Address, p string, info os.FileInfo) error) error {
	shards, err := os.ReadDir(s.objects)
	if err != nil {
		return fmt.Errorf("store: %w: %v", ErrDamaged, err)
	}
	for _, sh := range shards {
		if sh.Name() == "tmp" {
			continue
		}
		if !sh.IsDir() || len(sh.Name()) != 2 {
			return fmt.Errorf("store: %w: unexpected %s in objects/", ErrDamaged, sh.Name())
		}
		files, err := os.ReadDir(filepath.Join(s.objects, sh.Name()))
		if err != nil {
			return fmt.Errorf("store: %w: %v", ErrDamaged, err)
		}
		for _, f := range files {
			a, err := record.ParseAddress(record.AddressPrefix + sh.Name() + f.Name())
			if err != nil {
				return fmt.Errorf("store: %w: objects/%s/%s is not an object", ErrDamaged, sh.Name(), f.Name())
			}
			info, err := f.Info()
			if err != nil {
				return fmt.Errorf("store: %w", err)
			}
			if err := fn(a, filepath.Join(s.objects, sh.Name(), f.Name()), info); err != nil {
				return err
			}
		}
	}
	return nil
}
