package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Import stores a record received whole (from an export or a peer) as a
// new run, after verifying it from genesis. Every object it names must be
// in the store already: fetch and Put those first.
func (s *Store) Import(run string, r *record.Record) error { return s.ImportAs(run, r, false) }

// ImportAs is Import; with copy, the run (parked) is held as a copy in the
// same transaction: never resumed here ([Store.HandedOff]).
func (s *Store) ImportAs(run string, r *record.Record, copy bool) error {
	return s.importAs(run, r, copy, nil)
}

// importAs is ImportAs, storing owing o in the same transaction when not
// nil.
func (s *Store) importAs(run string, r *record.Record, copy bool, o *Owing) error {
	if err := checkRunID(run); err != nil {
		return err
	}
	if err := r.Verify(); err != nil {
		return fmt.Errorf("run %s: %w", run, err)
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	canon := make([][]byte, r.Len())
	for i := range r.Len() {
		seg := r.Segment(i)
		if err := s.haveAll(segmentRefs(&seg)); err != nil {
			return fmt.Errorf("run %s: segment %d: %w", run, i, err)
		}
		canon[i], _ = seg.Canonical()
	}
	return s.commit(func(tx *bolt.Tx) error {
		if tx.Bucket(bktRuns).Get([]byte(run)) != nil {
			return refuse(fmt.Errorf("run %s: %w", run, ErrRunExists))
		}
		if err := claimGenesis(tx, run, r.Genesis()); err != nil {
			return err
		}
		led, err := newLedger(tx, run)
		if err != nil {
			return err
		}
		segs := make([]record.Segment, r.Len())
		for i := range segs {
			segs[i] = r.Segment(i)
		}
		if _, err := led.follow(tx, segs); err != nil {
			return err
		}
		log := tx.Bucket(bktLog)
		rs := r.State()
		st := runState{unit: r.Unit(), grants: r.Grants(), head: r.Head(), n: uint64(r.Len()), phase: r.Phase(), kind: rs.Last, idle: rs.IdleUJ}
		for i := range canon {
			seq, err := log.NextSequence()
			if err != nil {
				return err
			}
			e := logEntry{run: []byte(run), index: uint64(i), prev: st.last, head: r.HeadAt(i), canon: canon[i]}
			if err := log.Put(seqKey(seq), e.encode()); err != nil {
				return err
			}
			st.last = seq
		}
		if err := tx.Bucket(bktRuns).Put([]byte(run), st.encode()); err != nil {
			return err
		}
		if st.phase == record.PhaseClosed {
			if err := tx.Bucket(bktClosed).Put([]byte(run), nowNS()); err != nil {
				return err
			}
		}
		if err := markArrival(tx, run, r, copy); err != nil {
			return err
		}
		if o != nil {
			if err := dropStrand(tx, run); err != nil {
				return err
			}
			if err := tx.Bucket(bktOwed).Put([]byte(run), o.encode()); err != nil {
				return err
			}
		}
		return tx.Bucket(bktPhases).Bucket(phaseKeys[st.phase]).Put([]byte(run), nil)
	})
}
