package store

import (
	"fmt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// CheckStats reports a [Store.Check].
type CheckStats struct {
	Runs, Segments, Objects int
}

// Check is the store's fsck: every run's record verifies from genesis
// against its stored heads and state, the phase index agrees with every
// run's state, and every object a segment reaches — directly or through
// declared refs — exists and hashes to its address.
func (s *Store) Check() (CheckStats, error) {
	var cs CheckStats
	ids, err := s.AllRuns()
	if err != nil {
		return cs, err
	}
	inPhase := map[string]record.Phase{}
	for p := record.Active; p <= record.Ended; p++ {
		list, err := s.Runs(p)
		if err != nil {
			return cs, err
		}
		for _, id := range list {
			if q, dup := inPhase[id]; dup {
				return cs, fmt.Errorf("store: %w: run %s indexed as both %s and %s", ErrDamaged, id, q, p)
			}
			inPhase[id] = p
		}
	}
	if len(inPhase) != len(ids) {
		return cs, fmt.Errorf("store: %w: phase index lists %d runs, store has %d", ErrDamaged, len(inPhase), len(ids))
	}
	for _, id := range ids {
		st, err := s.Load(id)
		if err != nil {
			return cs, err
		}
		if err := st.Verify(); err != nil {
			return cs, err
		}
		if p, ok := inPhase[id]; !ok || p != st.Run.Phase {
			return cs, fmt.Errorf("store: %w: run %s is %s but indexed as %s", ErrDamaged, id, st.Run.Phase, p)
		}
		r := record.New(st.Run.Unit, st.Run.Grants)
		for i := range st.Segments {
			r.Append(st.Segments[i]) // verified above
		}
		if r.Phase() != st.Run.Phase {
			return cs, fmt.Errorf("store: %w: run %s state says %s, record says %s", ErrDamaged, id, st.Run.Phase, r.Phase())
		}
		cs.Runs++
		cs.Segments += len(st.Segments)
	}
	live, err := s.reachable()
	if err != nil {
		return cs, err
	}
	for a := range live {
		if err := s.Verify(a); err != nil {
			return cs, fmt.Errorf("store: reachable object: %w", err)
		}
		cs.Objects++
	}
	return cs, nil
}
