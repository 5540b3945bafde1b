package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Append appends seg to run's record, in one durable transaction, if the
// run's head is still expectedHead. Before anything is written it checks,
// in order: that every object seg names (attestation, manifest, snapshot)
// is in the store ([ErrMissingObject]); that the run exists ([ErrNoRun]);
// that its head is expectedHead ([ErrHeadMoved]); and that pkg/record
// accepts seg after the stored state (a [*record.SegmentError]). Then it
// writes the segment and advances the head, state and phase index
// together, and returns the new head. Any refusal writes nothing, so of
// two writers offering the same expected head exactly one succeeds.
//
// Append takes no context: it is bounded by one commit, and an append
// abandoned while its commit went through would report a failure that
// did not happen.
func (s *Store) Append(run string, expectedHead record.Address, seg record.Segment) (record.Address, error) {
	return s.AppendAll(run, expectedHead, seg)
}

// AppendAll appends segs to run's record, in order, in one durable
// transaction: all of them or none. It makes the checks of [Store.Append]
// for every segment, each judged after the ones before it, before it
// writes anything, and returns the head after the last. (A park appends
// its Executed and Suspended segments together, so a failure leaves the
// record as it was.) With no segments it writes nothing and returns the
// head, if it is expectedHead.
func (s *Store) AppendAll(run string, expectedHead record.Address, segs ...record.Segment) (record.Address, error) {
	return s.appendAll(run, expectedHead, segs, nil)
}

// appendAll is AppendAll; then, when not nil, runs in the same transaction
// after the checks and before anything is written, and may refuse. The
// run's call ledger follows the segments in the same transaction
// (followCalls): the record and the ledger never disagree.
func (s *Store) appendAll(run string, expectedHead record.Address, segs []record.Segment, then func(tx *bolt.Tx) error) (record.Address, error) {
	if len(segs) == 0 && then == nil {
		return s.expectHead(run, expectedHead)
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	if err := s.haveSegmentRefs(run, segs); err != nil {
		return record.Address{}, err
	}
	var head record.Address
	err := s.commit(func(tx *bolt.Tx) error {
		st, c, heads, err := judgeAppend(tx, run, expectedHead, segs)
		if err != nil {
			return err
		}
		if err := followCalls(tx, run, segs, then); err != nil {
			return err
		}
		next, err := writeSegments(tx, run, st, segs, heads)
		if err != nil {
			return err
		}
		cs := c.State()
		next.head, next.phase, next.kind, next.idle = cs.Head, cs.Phase, cs.Last, cs.IdleUJ
		if err := putState(tx, run, st, next); err != nil {
			return err
		}
		head = next.head
		return nil
	})
	if err != nil {
		return record.Address{}, err
	}
	return head, nil
}

// expectHead is an append of nothing: it writes nothing, and returns the
// run's head if it is expectedHead ([ErrHeadMoved] otherwise).
func (s *Store) expectHead(run string, expectedHead record.Address) (record.Address, error) {
	var head record.Address
	err := s.view(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		if err != nil {
			return err
		}
		if st.head != expectedHead {
			return fmt.Errorf("run %s: %w: expected %s, head is %s", run, ErrHeadMoved, expectedHead, st.head)
		}
		head = st.head
		return nil
	})
	return head, err
}

// haveSegmentRefs is an append's first check, made with s.gc held and
// before the transaction: every object the segments name is stored
// ([ErrMissingObject]). Objects are durable before the segment that names
// them, and the held lock keeps a collection from taking one until the
// segment is committed.
func (s *Store) haveSegmentRefs(run string, segs []record.Segment) error {
	for i := range segs {
		if err := s.haveAll(segmentRefs(&segs[i])); err != nil {
			return fmt.Errorf("run %s: %w", run, err)
		}
	}
	return nil
}

// judgeAppend makes an append's checks in the transaction, in the order
// [Store.Append] gives, before anything is written: the run exists, its
// head is expectedHead, and pkg/record accepts every segment after the
// stored state, each after the ones before it. A refusal is refused, so
// the transaction stays untouched. It returns the run's stored state,
// the chain after the segments and the head after each.
func judgeAppend(tx *bolt.Tx, run string, expectedHead record.Address, segs []record.Segment) (runState, *record.Chain, []record.Address, error) {
	st, err := getState(tx, run)
	if err != nil {
		return runState{}, nil, nil, refuse(err)
	}
	if st.head != expectedHead {
		return runState{}, nil, nil, refuse(fmt.Errorf("run %s: %w: expected %s, head is %s", run, ErrHeadMoved, expectedHead, st.head))
	}
	r, err := summary(tx, run, st)
	if err != nil {
		return runState{}, nil, nil, refuse(err)
	}
	c := record.NewChain(r.State())
	heads := make([]record.Address, len(segs))
	for i := range segs {
		if heads[i], err = c.Append(&segs[i]); err != nil {
			return runState{}, nil, nil, refuse(fmt.Errorf("run %s: %w", run, err))
		}
	}
	return st, c, heads, nil
}

// writeSegments puts the judged segments in the log, each linked back to
// the run's segment before it, with the head after it. It comes after
// every check and the ledger's fold, so that nothing is written for a
// refused append. It returns the run's state with its count and last log
// entry advanced; the caller sets the chain's head, phase, kind and idle.
func writeSegments(tx *bolt.Tx, run string, st runState, segs []record.Segment, heads []record.Address) (runState, error) {
	log := tx.Bucket(bktLog)
	next := runState{unit: st.unit, grants: st.grants, n: st.n, last: st.last}
	for i := range segs {
		seq, err := log.NextSequence()
		if err != nil {
			return runState{}, err
		}
		canon, _ := segs[i].Canonical() // validated by judgeAppend's chain
		e := logEntry{run: []byte(run), index: next.n, prev: next.last, head: heads[i], canon: canon}
		if err := log.Put(seqKey(seq), e.encode()); err != nil {
			return runState{}, err
		}
		next.n, next.last = next.n+1, seq
	}
	return next, nil
}

// putState stores the run's state after an append, and keeps the indexes
// derived from it in step in the same transaction: when the store saw it
// closed, and its place in the phase index.
func putState(tx *bolt.Tx, run string, old, next runState) error {
	if err := tx.Bucket(bktRuns).Put([]byte(run), next.encode()); err != nil {
		return err
	}
	if next.phase == record.PhaseClosed && old.phase != record.PhaseClosed {
		if err := tx.Bucket(bktClosed).Put([]byte(run), nowNS()); err != nil {
			return err
		}
	}
	if next.phase != old.phase {
		phases := tx.Bucket(bktPhases)
		if err := phases.Bucket(phaseKeys[old.phase]).Delete([]byte(run)); err != nil {
			return err
		}
		if err := phases.Bucket(phaseKeys[next.phase]).Put([]byte(run), nil); err != nil {
			return err
		}
	}
	return nil
}

// segmentRefs are the objects a segment names.
func segmentRefs(s *record.Segment) []record.Address {
	var out []record.Address
	if !s.Attestation.IsZero() {
		out = append(out, s.Attestation)
	}
	if !s.Manifest.IsZero() {
		out = append(out, s.Manifest)
	}
	return append(out, s.Snapshot.Addresses()...)
}
