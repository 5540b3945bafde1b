package store

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

var phaseNames = [...]string{record.Active: "executing", record.Parked: "parked", record.Ended: "closed"}

// runState is what runs/<id>/state holds.
type runState struct {
	unit, grants record.Address
	head         record.Address
	n            uint64
	phase        record.Phase
}

const stateVersion = 1

// encodeState: version (1) ‖ unit (32) ‖ grants (32) ‖ head (32) ‖
// segment count (8, BE) ‖ phase (1: 0 executing, 1 parked, 2 closed).
func encodeState(st runState) []byte {
	b := make([]byte, 0, 106)
	b = append(b, stateVersion)
	b = append(b, st.unit[:]...)
	b = append(b, st.grants[:]...)
	b = append(b, st.head[:]...)
	b = binary.BigEndian.AppendUint64(b, st.n)
	return append(b, byte(st.phase))
}

func decodeState(b []byte) (runState, error) {
	var st runState
	if len(b) != 106 || b[0] != stateVersion || b[105] > byte(record.Ended) {
		return st, fmt.Errorf("%w: run state of %d bytes", ErrDamaged, len(b))
	}
	copy(st.unit[:], b[1:33])
	copy(st.grants[:], b[33:65])
	copy(st.head[:], b[65:97])
	st.n = binary.BigEndian.Uint64(b[97:105])
	st.phase = record.Phase(b[105])
	return st, nil
}

func setPhase(tx *bolt.Tx, id string, from, to record.Phase) error {
	p := tx.Bucket(bktPhases)
	if from != to {
		if err := p.Bucket([]byte(phaseNames[from])).Delete([]byte(id)); err != nil {
			return err
		}
	}
	return p.Bucket([]byte(phaseNames[to])).Put([]byte(id), nil)
}

func checkRunID(id string) error {
	if id == "" || len(id) > 128 || !utf8.ValidString(id) {
		return fmt.Errorf("%w: %q: 1 to 128 bytes of UTF-8", ErrBadRunID, id)
	}
	return nil
}

// Create starts a run's record: genesis over unit and grants. It returns
// the genesis head.
func (s *Store) Create(run string, unit, grants record.Address) (record.Address, error) {
	if err := checkRunID(run); err != nil {
		return record.Address{}, err
	}
	st := runState{unit: unit, grants: grants, head: record.Genesis(unit, grants), phase: record.Active}
	err := s.commit(func(tx *bolt.Tx) error {
		runs := tx.Bucket(bktRuns)
		if runs.Bucket([]byte(run)) != nil {
			return fmt.Errorf("run %s: %w", run, ErrRunExists)
		}
		b, err := runs.CreateBucket([]byte(run))
		if err != nil {
			return err
		}
		if _, err := b.CreateBucket(bktSegs); err != nil {
			return err
		}
		if err := b.Put(keyState, encodeState(st)); err != nil {
			return err
		}
		return setPhase(tx, run, record.Active, record.Active)
	})
	return st.head, err
}

// Append appends seg to run's record if run's head is still expectedHead,
// in one transaction: the transition is validated with pkg/record, every
// object the segment names must be in the store, then the segment is
// written and the head advanced. Any refusal writes nothing.
func (s *Store) Append(run string, expectedHead record.Address, seg record.Segment) (record.Address, error) {
	for _, a := range segmentRefs(&seg) {
		if !s.Has(a) {
			return record.Address{}, fmt.Errorf("run %s: %w: segment names %s", run, ErrMissingObject, a)
		}
	}
	var head record.Address
	err := s.commit(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktRuns).Bucket([]byte(run))
		if b == nil {
			return fmt.Errorf("run %s: %w", run, ErrNoRun)
		}
		st, err := decodeState(b.Get(keyState))
		if err != nil {
			return fmt.Errorf("run %s: %w", run, err)
		}
		if st.head != expectedHead {
			return fmt.Errorf("run %s: %w (expected %s, head is %s)", run, ErrHeadMoved, expectedHead, st.head)
		}
		cs := record.State{Head: st.head, Len: int(st.n), Phase: st.phase}
		segs := b.Bucket(bktSegs)
		if st.phase == record.Parked {
			last, err := readSegment(segs, st.n-1)
			if err != nil {
				return fmt.Errorf("run %s: %w", run, err)
			}
			cs.Parked = last.seg.Snapshot
		}
		h, err := record.NewChain(cs).Append(&seg)
		if err != nil {
			return fmt.Errorf("run %s: %w", run, err)
		}
		canon, _ := seg.Canonical() // validated by Append
		val := append(append(make([]byte, 0, 32+len(canon)), h[:]...), canon...)
		if err := segs.Put(binary.BigEndian.AppendUint64(nil, st.n), val); err != nil {
			return err
		}
		next := runState{unit: st.unit, grants: st.grants, head: h, n: st.n + 1, phase: st.phase}
		switch seg.Kind {
		case record.Suspended:
			next.phase = record.Parked
		case record.Resumed:
			next.phase = record.Active
		case record.Closed:
			next.phase = record.Ended
		}
		if err := b.Put(keyState, encodeState(next)); err != nil {
			return err
		}
		head = h
		return setPhase(tx, run, st.phase, next.phase)
	})
	return head, err
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

type storedSegment struct {
	head record.Address
	seg  record.Segment
}

func readSegment(segs *bolt.Bucket, i uint64) (storedSegment, error) {
	v := segs.Get(binary.BigEndian.AppendUint64(nil, i))
	if len(v) < 33 {
		return storedSegment{}, fmt.Errorf("%w: segment %d missing or short", ErrDamaged, i)
	}
	var ss storedSegment
	copy(ss.head[:], v[:32])
	seg, err := record.DecodeSegment(v[32:])
	if err != nil {
		return storedSegment{}, fmt.Errorf("%w: segment %d: %v", ErrDamaged, i, err)
	}
	ss.seg = seg
	return ss, nil
}

// Run is a run's summary, read in O(1).
type Run struct {
	ID           string
	Unit, Grants record.Address
	Head         record.Address
	Len          int
	Phase        record.Phase
}

// Head returns a run's summary without reading its segments.
func (s *Store) Head(run string) (Run, error) {
	var r Run
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktRuns).Bucket([]byte(run))
		if b == nil {
			return fmt.Errorf("run %s: %w", run, ErrNoRun)
		}
		st, err := decodeState(b.Get(keyState))
		if err != nil {
			return fmt.Errorf("run %s: %w", run, err)
		}
		r = Run{ID: run, Unit: st.unit, Grants: st.grants, Head: st.head, Len: int(st.n), Phase: st.phase}
		return nil
	})
	return r, err
}

// Runs lists the ids of the runs in a phase, from the phase index.
func (s *Store) Runs(phase record.Phase) ([]string, error) {
	if int(phase) >= len(phaseNames) {
		return nil, fmt.Errorf("store: unknown phase %d", phase)
	}
	var ids []string
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktPhases).Bucket([]byte(phaseNames[phase])).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	return ids, err
}

// AllRuns lists every run id.
func (s *Store) AllRuns() ([]string, error) {
	var ids []string
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktRuns).ForEachBucket(func(k []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	return ids, err
}

// Stored is a run's record as stored: segments decoded from their bytes
// and the head stored beside each, not yet verified.
type Stored struct {
	Run      Run
	Segments []record.Segment
	Heads    []record.Address
}

// Verify recomputes the stored record from genesis against every stored
// head and the run's head.
func (st *Stored) Verify() error {
	if err := record.Verify(st.Run.Unit, st.Run.Grants, st.Segments, st.Heads); err != nil {
		return fmt.Errorf("run %s: %w", st.Run.ID, err)
	}
	want := record.Genesis(st.Run.Unit, st.Run.Grants)
	if n := len(st.Heads); n > 0 {
		want = st.Heads[n-1]
	}
	if want != st.Run.Head {
		return fmt.Errorf("run %s: %w: state head %s, last segment's %s", st.Run.ID, record.ErrHeadMismatch, st.Run.Head, want)
	}
	return nil
}

// Load reads a run's stored record without verifying it.
func (s *Store) Load(run string) (*Stored, error) {
	out := &Stored{}
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktRuns).Bucket([]byte(run))
		if b == nil {
			return fmt.Errorf("run %s: %w", run, ErrNoRun)
		}
		st, err := decodeState(b.Get(keyState))
		if err != nil {
			return fmt.Errorf("run %s: %w", run, err)
		}
		out.Run = Run{ID: run, Unit: st.unit, Grants: st.grants, Head: st.head, Len: int(st.n), Phase: st.phase}
		segs := b.Bucket(bktSegs)
		if segs == nil {
			return fmt.Errorf("run %s: %w: no segments bucket", run, ErrDamaged)
		}
		if n := uint64(segs.Stats().KeyN); n != st.n {
			return fmt.Errorf("run %s: %w: %d segments stored, state says %d", run, ErrDamaged, n, st.n)
		}
		out.Segments = make([]record.Segment, 0, st.n)
		out.Heads = make([]record.Address, 0, st.n)
		for i := uint64(0); i < st.n; i++ {
			ss, err := readSegment(segs, i)
			if err != nil {
				return fmt.Errorf("run %s: %w", run, err)
			}
			out.Segments = append(out.Segments, ss.seg)
			out.Heads = append(out.Heads, ss.head)
		}
		return nil
	})
	return out, err
}

// Record loads a run's record and verifies it from genesis.
func (s *Store) Record(run string) (*record.Record, error) {
	st, err := s.Load(run)
	if err != nil {
		return nil, err
	}
	if err := st.Verify(); err != nil {
		return nil, err
	}
	r := record.New(st.Run.Unit, st.Run.Grants)
	for i := range st.Segments {
		if _, err := r.Append(st.Segments[i]); err != nil {
			return nil, fmt.Errorf("run %s: %w", run, err)
		}
	}
	return r, nil
}

// Import stores a whole verified record as a new run (a run received from
// another host). The objects it names must already be in the store.
func (s *Store) Import(run string, r *record.Record) error {
	if err := checkRunID(run); err != nil {
		return err
	}
	if err := r.Verify(); err != nil {
		return fmt.Errorf("run %s: %w", run, err)
	}
	for i := range r.Len() {
		seg := r.Segment(i)
		for _, a := range segmentRefs(&seg) {
			if !s.Has(a) {
				return fmt.Errorf("run %s: %w: segment %d names %s", run, ErrMissingObject, i, a)
			}
		}
	}
	return s.commit(func(tx *bolt.Tx) error {
		runs := tx.Bucket(bktRuns)
		if runs.Bucket([]byte(run)) != nil {
			return fmt.Errorf("run %s: %w", run, ErrRunExists)
		}
		b, err := runs.CreateBucket([]byte(run))
		if err != nil {
			return err
		}
		segs, err := b.CreateBucket(bktSegs)
		if err != nil {
			return err
		}
		for i := range r.Len() {
			seg := r.Segment(i)
			canon, _ := seg.Canonical()
			h := r.HeadAt(i)
			if err := segs.Put(binary.BigEndian.AppendUint64(nil, uint64(i)), append(h[:], canon...)); err != nil {
				return err
			}
		}
		st := runState{unit: r.Unit(), grants: r.Grants(), head: r.Head(), n: uint64(r.Len()), phase: r.Phase()}
		if err := b.Put(keyState, encodeState(st)); err != nil {
			return err
		}
		return setPhase(tx, run, st.phase, st.phase)
	})
}
