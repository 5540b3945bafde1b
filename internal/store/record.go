package store

import (
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// decode, the chain's rules hold, every recomputed head equals the head
// stored beside the segment, and the run's state agrees with the last. An
// edited or half-written segment fails with a [*record.SegmentError]
// naming it.
func (s *Store) Record(run string) (*record.Record, error) {
	var r *record.Record
	err := s.view(func(tx *bolt.Tx) (err error) {
		r, err = readRecord(tx, run)
		return err
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

func readRecord(tx *bolt.Tx, run string) (*record.Record, error) {
	st, err := getState(tx, run)
	if err != nil {
		return nil, err
	}
	entries, err := runEntries(tx, run, st)
	if err != nil {
		return nil, err
	}
	r := record.New(st.unit, st.grants)
	for i, e := range entries {
		seg, err := record.DecodeSegment(e.canon)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", run, &record.SegmentError{Index: i, Err: fmt.Errorf("%w: %w", ErrDamaged, err)})
		}
		h, err := r.Append(seg)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", run, err)
		}
		if h != e.head {
			return nil, fmt.Errorf("run %s: %w", run, &record.SegmentError{Index: i,
				Err: fmt.Errorf("%w: stored %s, recomputed %s", record.ErrHeadMismatch, e.head, h)})
		}
	}
	if rs := r.State(); rs.Head != st.head || rs.Phase != st.phase || rs.Last != st.kind || rs.IdleUJ != st.idle {
		return nil, fmt.Errorf("run %s: %w: state says head %s, %s, last %s, idle %d µJ; the segments give %s, %s, last %s, idle %d µJ",
			run, ErrDamaged, st.head, st.phase, st.kind, st.idle, rs.Head, rs.Phase, rs.Last, rs.IdleUJ)
	}
	return r, nil
}

// runEntries returns a run's log entries in order, walking back from its
// last. A missing or misplaced entry is a [*record.SegmentError] naming
// the segment.
func runEntries(tx *bolt.Tx, run string, st runState) ([]logEntry, error) {
	// Capacity is not taken from the state on trust: a damaged count
	// must fail at its first missing entry, not in an allocation.
	entries := make([]logEntry, 0, min(st.n, 1<<16))
	seq := st.last
	for i := st.n; i > 0; i-- {
		e, err := logAt(tx, run, seq, i-1)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", run, &record.SegmentError{Index: int(i - 1), Err: err})
		}
		entries = append(entries, e)
		seq = e.prev
	}
	if seq != 0 {
		return nil, fmt.Errorf("run %s: %w: segment 0 links to log entry %d", run, ErrDamaged, seq)
	}
	slices.Reverse(entries)
	return entries, nil
}

// Raw is a run's record as stored, not verified: see [Store.Raw].
type Raw struct {
	Unit, Grants record.Address   // the ids the run was created with
	Segments     []record.Segment // in order
	Heads        []record.Address // the head stored beside each segment
	Head         record.Address   // the head the run's state holds
}

// Raw reads a run's segments and the heads stored beside them without
// verifying the chain, for a caller that verifies in its own order (the
// resume preconditions, which report an edited record as a failed
// precondition naming the segment): pass the fields to [record.Verify].
// It only decodes: a segment whose bytes are not canonical, or a log
// entry missing or out of place, is a [*record.SegmentError] naming it.
func (s *Store) Raw(run string) (Raw, error) {
	var raw Raw
	err := s.view(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		if err != nil {
			return err
		}
		entries, err := runEntries(tx, run, st)
		if err != nil {
			return err
		}
		raw = Raw{Unit: st.unit, Grants: st.grants, Head: st.head,
			Segments: make([]record.Segment, len(entries)), Heads: make([]record.Address, len(entries))}
		for i, e := range entries {
			// DecodeSegment copies what it keeps: canon aliases the map.
			if raw.Segments[i], err = record.DecodeSegment(e.canon); err != nil {
				return fmt.Errorf("run %s: %w", run, &record.SegmentError{Index: i, Err: fmt.Errorf("%w: %w", ErrDamaged, err)})
			}
			raw.Heads[i] = e.head
		}
		return nil
	})
	if err != nil {
		return Raw{}, err
	}
	return raw, nil
}
