package store

import (
	"fmt"
	"slices"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
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
	st := runState{unit: unit, grants: grants, head: record.Genesis(unit, grants), phase: record.Active}
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
	s.gc.RLock()
	defer s.gc.RUnlock()
	for i := range segs {
		if err := s.haveAll(segmentRefs(&segs[i])); err != nil {
			return record.Address{}, fmt.Errorf("run %s: %w", run, err)
		}
	}
	var head record.Address
	err := s.commit(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		if err != nil {
			return refuse(err)
		}
		if st.head != expectedHead {
			return refuse(fmt.Errorf("run %s: %w: expected %s, head is %s", run, ErrHeadMoved, expectedHead, st.head))
		}
		r, err := summary(tx, run, st)
		if err != nil {
			return refuse(err)
		}
		// Judge every segment before writing any: a refusal must leave
		// the transaction untouched.
		c := record.NewChain(r.State())
		heads := make([]record.Address, len(segs))
		for i := range segs {
			if heads[i], err = c.Append(&segs[i]); err != nil {
				return refuse(fmt.Errorf("run %s: %w", run, err))
			}
		}
		if err := followCalls(tx, run, segs, then); err != nil {
			return err
		}
		log := tx.Bucket(bktLog)
		next := runState{unit: st.unit, grants: st.grants, n: st.n, last: st.last}
		for i := range segs {
			seq, err := log.NextSequence()
			if err != nil {
				return err
			}
			canon, _ := segs[i].Canonical() // validated by c.Append
			e := logEntry{run: []byte(run), index: next.n, prev: next.last, head: heads[i], canon: canon}
			if err := log.Put(seqKey(seq), e.encode()); err != nil {
				return err
			}
			next.n, next.last = next.n+1, seq
		}
		next.head, next.phase, next.kind, next.idle = c.State().Head, c.State().Phase, c.State().Last, c.State().IdleUJ
		if err := tx.Bucket(bktRuns).Put([]byte(run), next.encode()); err != nil {
			return err
		}
		if next.phase == record.Ended && st.phase != record.Ended {
			if err := tx.Bucket(bktClosed).Put([]byte(run), nowNS()); err != nil {
				return err
			}
		}
		if next.phase != st.phase {
			phases := tx.Bucket(bktPhases)
			if err := phases.Bucket(phaseKeys[st.phase]).Delete([]byte(run)); err != nil {
				return err
			}
			if err := phases.Bucket(phaseKeys[next.phase]).Put([]byte(run), nil); err != nil {
				return err
			}
		}
		head = next.head
		return nil
	})
	if err != nil {
		return record.Address{}, err
	}
	return head, nil
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
	if st.phase != record.Parked {
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

// Record reads a run's record and verifies it from genesis: every segment
// is where the run's chain of log entries says, its canonical bytes
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

// Import stores a record received whole (from an export or a peer) as a
// new run, after verifying it from genesis. Every object it names must be
// in the store already: fetch and Put those first.
func (s *Store) Import(run string, r *record.Record) error { return s.ImportAs(run, r, false) }

// ImportAs is Import; with copy, the run (parked) is held as a copy in the
// same transaction: never resumed here ([Store.HandedOff]).
func (s *Store) ImportAs(run string, r *record.Record, copy bool) error {
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
		if st.phase == record.Ended {
			if err := tx.Bucket(bktClosed).Put([]byte(run), nowNS()); err != nil {
				return err
			}
		}
		if err := markArrival(tx, run, r, copy); err != nil {
			return err
		}
		return tx.Bucket(bktPhases).Bucket(phaseKeys[st.phase]).Put([]byte(run), nil)
	})
}
