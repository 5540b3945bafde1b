package store

import (
	"fmt"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// MaxRunIDLen bounds a run id, in bytes.
const MaxRunIDLen = 128

func checkRunID(id string) error {
	if id == "" || len(id) > MaxRunIDLen || !utf8.ValidString(id) {
		return fmt.Errorf("%w: %q: want 1 to %d bytes of UTF-8", ErrRunID, id, MaxRunIDLen)
	}
	return nil
}

// Run is a run's summary, read without reading its segments.
type Run struct {
	ID           string
	Unit, Grants record.Address // the ids genesis binds
	Head         record.Address // head after the last segment; genesis if none
	Len          int            // number of segments
	Phase        record.Phase
	Last         record.Kind     // the last segment's kind; 0 if none
	IdleUJ       uint64          // idle_uj summed over the Resumed segments
	Parked       record.Snapshot // the suspended snapshot, while Phase is Parked
}

// State returns the chain state the run's next segment is judged against.
func (r Run) State() record.State {
	return record.State{Head: r.Head, Len: r.Len, Phase: r.Phase, Last: r.Last, IdleUJ: r.IdleUJ, Parked: r.Parked}
}

// Create stores a new run's genesis: head₀ over unit and grants, no
// segments, phase executing. It returns head₀. The run id is the caller's
// name for the run (1 to [MaxRunIDLen] bytes of UTF-8); an id in use is
// [ErrRunExists].
func (s *Store) Create(run string, unit, grants record.Address) (record.Address, error) {
	if err := checkRunID(run); err != nil {
		return record.Address{}, err
	}
	st := runState{unit: unit, grants: grants, head: record.Genesis(unit, grants), phase: record.PhaseExecuting}
	err := s.commit(func(tx *bolt.Tx) error {
		if tx.Bucket(bktRuns).Get([]byte(run)) != nil {
			return refuse(fmt.Errorf("run %s: %w", run, ErrRunExists))
		}
		if err := claimGenesis(tx, run, st.head); err != nil {
			return err
		}
		if _, err := newLedger(tx, run); err != nil {
			return err
		}
		if err := tx.Bucket(bktRuns).Put([]byte(run), st.encode()); err != nil {
			return err
		}
		return tx.Bucket(bktPhases).Bucket(phaseKeys[st.phase]).Put([]byte(run), nil)
	})
	if err != nil {
		return record.Address{}, err
	}
	return st.head, nil
}

// getState returns a run's decoded state.
func getState(tx *bolt.Tx, run string) (runState, error) {
	v := tx.Bucket(bktRuns).Get([]byte(run))
	if v == nil {
		return runState{}, fmt.Errorf("run %s: %w", run, ErrNoRun)
	}
	st, err := decodeState(v)
	if err == nil && st.format != stateFormat {
		err = fmt.Errorf("%w: run state of format %d in a store of schema %d", ErrDamaged, st.format, SchemaVersion)
	}
	if err != nil {
		return runState{}, fmt.Errorf("run %s: %w", run, err)
	}
	return st, nil
}

// logAt reads the log entry seq and checks that it is segment index of run.
func logAt(tx *bolt.Tx, run string, seq, index uint64) (logEntry, error) {
	v := tx.Bucket(bktLog).Get(seqKey(seq))
	if v == nil {
		return logEntry{}, fmt.Errorf("%w: segment %d (log entry %d) is missing", ErrDamaged, index, seq)
	}
	e, err := decodeLogEntry(v)
	if err != nil {
		return logEntry{}, fmt.Errorf("segment %d (log entry %d): %w", index, seq, err)
	}
	if string(e.run) != run || e.index != index {
		return logEntry{}, fmt.Errorf("%w: log entry %d is segment %d of run %q, not segment %d", ErrDamaged, seq, e.index, e.run, index)
	}
	return e, nil
}

// summary builds a Run from its state, reading the last segment for the
// parked snapshot: a parked run's last segment is its Suspended one.
func summary(tx *bolt.Tx, run string, st runState) (Run, error) {
	r := Run{ID: run, Unit: st.unit, Grants: st.grants, Head: st.head, Len: int(st.n), Phase: st.phase, Last: st.kind, IdleUJ: st.idle}
	if st.phase != record.PhaseParked {
		return r, nil
	}
	if st.n == 0 {
		return Run{}, fmt.Errorf("run %s: %w: parked with no segments", run, ErrDamaged)
	}
	e, err := logAt(tx, run, st.last, st.n-1)
	if err != nil {
		return Run{}, fmt.Errorf("run %s: %w", run, err)
	}
	seg, err := record.DecodeSegment(e.canon)
	if err != nil || seg.Kind != record.Suspended {
		return Run{}, fmt.Errorf("run %s: %w: parked, but segment %d is not a readable suspension: %v", run, ErrDamaged, st.n-1, err)
	}
	r.Parked = seg.Snapshot
	return r, nil
}

// Run returns a run's summary in O(1): its state and, while parked, its
// last segment.
func (s *Store) Run(run string) (Run, error) {
	var r Run
	err := s.view(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		if err != nil {
			return err
		}
		r, err = summary(tx, run, st)
		return err
	})
	return r, err
}

// Head returns a run's head in O(1).
func (s *Store) Head(run string) (record.Address, error) {
	var h record.Address
	err := s.view(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		h = st.head
		return err
	})
	return h, err
}

// Runs lists, in id order, the runs in a phase, from the phase index.
func (s *Store) Runs(phase record.Phase) ([]string, error) {
	if int(phase) >= len(phaseKeys) {
		return nil, fmt.Errorf("store: no phase %d", phase)
	}
	var ids []string
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktPhases).Bucket(phaseKeys[phase]).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	return ids, err
}

// AllRuns lists every run id, in id order.
func (s *Store) AllRuns() ([]string, error) {
	var ids []string
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktRuns).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	return ids, err
}

// ReadRun reads a stored run's unit spec and grant set from the objects
// its genesis binds, rehashed and decoded strictly (pkg/unit).
func (s *Store) ReadRun(r Run) (unit.Spec, unit.Grants, error) {
	sb, err := s.ReadAll(r.Unit)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, fmt.Errorf("run %s: unit spec: %w", r.ID, err)
	}
	spec, err := unit.DecodeSpec(sb)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, fmt.Errorf("run %s: unit spec: %w", r.ID, err)
	}
	gb, err := s.ReadAll(r.Grants)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, fmt.Errorf("run %s: grant set: %w", r.ID, err)
	}
	grants, err := unit.DecodeGrants(gb)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, fmt.Errorf("run %s: grant set: %w", r.ID, err)
	}
	return *spec, *grants, nil
}
