package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// A run has one timeline. The store indexes every run by its genesis
// head, so a second run of one genesis (an import of a bundle already
// held, under any id) is refused, and it remembers the runs an export
// handed to another host: such a run is not resumed here until a record
// that extends it comes back ([Store.Extend]).

// claimGenesis indexes run under genesis g, refusing a genesis another run
// holds.
func claimGenesis(tx *bolt.Tx, run string, g record.Address) error {
	genes := tx.Bucket(bktGenes)
	if held := genes.Get(g[:]); held != nil && string(held) != run {
		return refuse(fmt.Errorf("run %s: %w: run %s (genesis %s)", run, ErrGenesisHeld, held, g))
	}
	return genes.Put(g[:], []byte(run))
}

// RunOfGenesis returns the id of the run whose genesis is g, if the store
// holds one.
func (s *Store) RunOfGenesis(g record.Address) (string, bool, error) {
	var id string
	var ok bool
	err := s.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktGenes).Get(g[:]); v != nil {
			id, ok = string(v), true
		}
		return nil
	})
	return id, ok, err
}

// HandOff marks parked run as handed off at head: its bundle (whose record
// ends at head) is leaving for another host. Nothing may be appended to a
// handed-off run until a record extending head is imported back
// ([Store.Extend]); the daemon refuses to resume or close it. A run that
// is not parked, or whose head is not head, is refused ([ErrHeadMoved]).
// Handing off a run already handed off at head is a no-op.
func (s *Store) HandOff(run string, head record.Address) error {
	return s.commit(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		if err != nil {
			return refuse(err)
		}
		if st.head != head {
			return refuse(fmt.Errorf("run %s: %w: handing off at %s, head is %s", run, ErrHeadMoved, head, st.head))
		}
		if st.phase != record.Parked {
			return refuse(fmt.Errorf("run %s: only a parked run is handed off (it is %s)", run, phaseName(st.phase, true)))
		}
		return tx.Bucket(bktHandof).Put([]byte(run), head[:])
	})
}

// Reclaim clears run's handoff: the export that made it did not deliver
// its bundle whole. A run not handed off is left as it is.
func (s *Store) Reclaim(run string) error {
	return s.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bktHandof).Delete([]byte(run))
	})
}

// HandedOff reports whether run is handed off, and the head it was handed
// off at.
func (s *Store) HandedOff(run string) (record.Address, bool, error) {
	var head record.Address
	var ok bool
	err := s.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktHandof).Get([]byte(run)); len(v) == 32 {
			head, ok = record.Address(v), true
		}
		return nil
	})
	return head, ok, err
}

// Extend imports r over handed-off run: r must have the run's genesis and
// carry, at the run's length, the run's head — it is the same timeline,
// continued elsewhere. The segments past the run's are appended (each
// judged by pkg/record, after every object they name is in the store) and
// the handoff is cleared, in one transaction. A run not handed off is
// [ErrRunExists]; a record that does not extend it, [ErrNotExtension].
func (s *Store) Extend(run string, r *record.Record) (record.Address, error) {
	if err := r.Verify(); err != nil {
		return record.Address{}, fmt.Errorf("run %s: %w", run, err)
	}
	held, err := s.Run(run)
	if err != nil {
		return record.Address{}, err
	}
	if _, ok, err := s.HandedOff(run); err != nil {
		return record.Address{}, err
	} else if !ok {
		return record.Address{}, fmt.Errorf("run %s: %w (it was not handed off)", run, ErrRunExists)
	}
	if r.Genesis() != record.Genesis(held.Unit, held.Grants) {
		return record.Address{}, fmt.Errorf("run %s: %w: another genesis", run, ErrNotExtension)
	}
	if r.Len() < held.Len || held.Len > 0 && r.HeadAt(held.Len-1) != held.Head {
		return record.Address{}, fmt.Errorf("run %s: %w: the record held (%d segments, head %s) is not a prefix of the one imported", run, ErrNotExtension, held.Len, held.Head)
	}
	segs := make([]record.Segment, 0, r.Len()-held.Len)
	for i := held.Len; i < r.Len(); i++ {
		segs = append(segs, r.Segment(i))
	}
	return s.appendAll(run, held.Head, segs, func(tx *bolt.Tx) error {
		if tx.Bucket(bktHandof).Get([]byte(run)) == nil {
			return refuse(fmt.Errorf("run %s: %w (it was not handed off)", run, ErrRunExists))
		}
		if err := tx.Bucket(bktArrive).Put([]byte(run), nowNS()); err != nil {
			return err
		}
		return tx.Bucket(bktHandof).Delete([]byte(run))
	})
}
