package store

import (
	"encoding/binary"
	"fmt"
	"math"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Bucket and key names; the package doc draws the tree.
var (
	bktMeta   = []byte("meta")
	bktRuns   = []byte("runs")
	bktPhases = []byte("phases")
	bktRefs   = []byte("refs")
	bktLog    = []byte("log")
	bktGenes  = []byte("geneses")
	bktHandof = []byte("handoffs")
	bktClosed = []byte("closed")   // run id → when the store saw it closed (8 bytes, Unix ns)
	bktPins   = []byte("pins")     // run id → nothing: its snapshots are kept
	bktFreed  = []byte("released") // run id → when its image snapshots were released (Unix ns)
	bktArrive = []byte("imported") // run id → when its record last arrived in a bundle (Unix ns)
	bktRoots  = []byte("roots")    // address → nothing: kept whatever the records reach (the host's audit chain)
	bktTrust  = []byte("trust")
	bktCalls  = []byte("calls") // run id → the run's call ledger (ledger.go)
	bktOwed   = []byte("owed")  // run id → the slabs it lacks (owed.go)
	bktHolds  = []byte("holds") // run id → the target it is held for (owed.go)
	// bktStrand: run id → why its owing is stranded (owed.go). Within
	// schema 7: made by the first strand, absent read as empty, so an
	// older daemon reads the store (and ignores it).
	bktStrand = []byte("stranded")
	keyVer    = []byte("version")
)

// phaseKeys name the phase index's buckets, by [record.Phase].
var phaseKeys = [...][]byte{
	record.PhaseExecuting: []byte("executing"),
	record.PhaseParked:    []byte("parked"),
	record.PhaseClosed:    []byte("closed"),
}

// A migration takes the schema from version to-1 to version to, inside
// the transaction that records the new version.
type migration struct {
	to   uint32
	name string
	fn   func(tx *bolt.Tx) error
}

// migrations is ordered and append-only: a released entry never changes.
// A new store is created at version 1 and brought up through every entry,
// so each migration runs on every store, old or new.
var migrations = []migration{
	{2, "phase index: phases/<phase>/<run id>, built from run states", migratePhaseIndex},
	{3, "one timeline per run and retention: geneses/<head₀> → run id, built from run states; handoffs, closed (closed runs dated at the migration), pins, released, imported, roots", migrateTimelines},
	{4, "trusted host keys: trust/<key id>, empty", migrateTrust},
	{5, "run states of format 2: the last segment's kind and the idle-energy total, computed from each run's log", migrateStateFormat2},
	{6, "the call ledger: calls/<run id>, folded from the accounts of every run not closed", migrateCallLedger},
	{7, "post-copy migration: owed/<run id> and holds/<run id>, empty", migratePostCopy},
}

// SchemaVersion is the version this package writes: the last migration's
// (a test holds the two together).
const SchemaVersion = 7

// createV1 writes the version-1 schema: meta, runs, log, refs.
func createV1(tx *bolt.Tx) error {
	for _, b := range [][]byte{bktMeta, bktRuns, bktLog, bktRefs} {
		if _, err := tx.CreateBucket(b); err != nil {
			return err
		}
	}
	return tx.Bucket(bktMeta).Put(keyVer, binary.BigEndian.AppendUint32(nil, 1))
}

// migratePhaseIndex (1 → 2) builds the phase index from every run's state,
// so listing runs by phase no longer visits every run.
func migratePhaseIndex(tx *bolt.Tx) error {
	phases, err := tx.CreateBucket(bktPhases)
	if err != nil {
		return err
	}
	for _, k := range phaseKeys {
		if _, err := phases.CreateBucket(k); err != nil {
			return err
		}
	}
	runs := tx.Bucket(bktRuns)
	if runs == nil {
		return fmt.Errorf("%w: no runs bucket", ErrDamaged)
	}
	return runs.ForEach(func(id, v []byte) error {
		st, err := decodeState(v)
		if err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		return phases.Bucket(phaseKeys[st.phase]).Put(id, nil)
	})
}

// migrateTimelines (2 → 3) indexes every run by its genesis and adds the
// (empty) handoff bucket. Two runs of one genesis, which a store could hold
// before runs had nonces, are both kept; the index names the first.
func migrateTimelines(tx *bolt.Tx) error {
	genes, err := tx.CreateBucket(bktGenes)
	if err != nil {
		return err
	}
	for _, b := range [][]byte{bktHandof, bktClosed, bktPins, bktFreed, bktArrive, bktRoots} {
		if _, err := tx.CreateBucket(b); err != nil {
			return err
		}
	}
	runs := tx.Bucket(bktRuns)
	if runs == nil {
		return fmt.Errorf("%w: no runs bucket", ErrDamaged)
	}
	now := nowNS()
	return runs.ForEach(func(id, v []byte) error {
		st, err := decodeState(v)
		if err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		if st.phase == record.PhaseClosed {
			if err := tx.Bucket(bktClosed).Put(id, now); err != nil {
				return err
			}
		}
		g := record.Genesis(st.unit, st.grants)
		if genes.Get(g[:]) != nil {
			return nil
		}
		return genes.Put(g[:], id)
	})
}

// migrate creates or upgrades the schema in one transaction: a crash
// mid-migration leaves the store at its old version.
func (s *Store) migrate() error {
	err := s.update(func(tx *bolt.Tx) error {
		ver := uint32(0)
		if meta := tx.Bucket(bktMeta); meta != nil {
			v := meta.Get(keyVer)
			if len(v) != 4 {
				return fmt.Errorf("%w: schema version is %d bytes", ErrDamaged, len(v))
			}
			ver = binary.BigEndian.Uint32(v)
		} else {
			if err := createV1(tx); err != nil {
				return err
			}
			ver = 1
		}
		switch {
		case ver == 0:
			return fmt.Errorf("%w: schema version 0", ErrDamaged)
		case ver > SchemaVersion:
			return fmt.Errorf("%w: version %d is newer than this package's %d", ErrSchema, ver, SchemaVersion)
		}
		for _, m := range migrations {
			if m.to <= ver {
				continue
			}
			if err := m.fn(tx); err != nil {
				return fmt.Errorf("migration %d→%d (%s): %w", m.to-1, m.to, m.name, err)
			}
			ver = m.to
		}
		return tx.Bucket(bktMeta).Put(keyVer, binary.BigEndian.AppendUint32(nil, ver))
	})
	if err != nil {
		return fmt.Errorf("store %s: %w", s.dir, err)
	}
	return nil
}

// runState is what runs/<id> holds: enough to judge the next segment
// ([record.State]) without reading segments, except the parked snapshot,
// which is the last segment's, one lookup away.
type runState struct {
	unit, grants record.Address
	head         record.Address
	n            uint64       // segments
	phase        record.Phase // after the last segment
	last         uint64       // log sequence number of the last segment; 0 if none
	kind         record.Kind  // the last segment's kind; 0 if none (format 2)
	idle         uint64       // idle_uj summed over the Resumed segments (format 2)
	format       byte         // 1 only while migration 5 reads an old state
}

const (
	stateFormat = 2
	stateLenV1  = 1 + 32 + 32 + 32 + 8 + 1 + 8
	stateLen    = stateLenV1 + 1 + 8
)

// encode: format (1 byte, 2) ‖ unit id (32) ‖ grants id (32) ‖ head (32)
// ‖ segment count (8) ‖ phase (1: 0 executing, 1 parked, 2 closed) ‖ last
// segment's sequence number (8) ‖ last segment's kind (1; 0 if none) ‖
// idle-energy total in µJ (8). Integers are big-endian. Format 1 was the
// first 114 bytes, without the last two fields.
func (st runState) encode() []byte {
	b := make([]byte, 0, stateLen)
	b = append(b, stateFormat)
	b = append(b, st.unit[:]...)
	b = append(b, st.grants[:]...)
	b = append(b, st.head[:]...)
	b = binary.BigEndian.AppendUint64(b, st.n)
	b = append(b, byte(st.phase))
	b = binary.BigEndian.AppendUint64(b, st.last)
	b = append(b, byte(st.kind))
	return binary.BigEndian.AppendUint64(b, st.idle)
}

// decodeState reads format 2, and format 1 for the migrations that run
// before migration 5 rewrites it; [getState] accepts format 2 only.
func decodeState(b []byte) (runState, error) {
	var st runState
	ok := len(b) == stateLen && b[0] == stateFormat || len(b) == stateLenV1 && b[0] == 1
	if !ok || b[105] > byte(record.PhaseClosed) {
		return st, fmt.Errorf("%w: run state of %d bytes is not format %d", ErrDamaged, len(b), stateFormat)
	}
	st.format = b[0]
	copy(st.unit[:], b[1:33])
	copy(st.grants[:], b[33:65])
	copy(st.head[:], b[65:97])
	st.n = binary.BigEndian.Uint64(b[97:105])
	st.phase = record.Phase(b[105])
	st.last = binary.BigEndian.Uint64(b[106:114])
	if (st.n == 0) != (st.last == 0) {
		return st, fmt.Errorf("%w: run state of %d segments with last sequence number %d", ErrDamaged, st.n, st.last)
	}
	if st.format == stateFormat {
		st.kind = record.Kind(b[114])
		st.idle = binary.BigEndian.Uint64(b[115:123])
		if (st.n == 0) != (st.kind == 0) || st.kind > record.Closed {
			return st, fmt.Errorf("%w: run state of %d segments with last kind %s", ErrDamaged, st.n, st.kind)
		}
	}
	return st, nil
}

// migrateStateFormat2 (4 → 5) rewrites every run state in format 2: the
// last segment's kind, for the rule that a Suspended segment follows an
// Executed one, and the idle-energy total, for the rule that it never
// overflows (docs/record-format.md), read from the run's log. A total
// past 2⁶⁴−1 (a record no host could have metered) is kept at 2⁶⁴−1, so
// the run's next resume is refused rather than the store's opening.
func migrateStateFormat2(tx *bolt.Tx) error {
	runs := tx.Bucket(bktRuns)
	if runs == nil {
		return fmt.Errorf("%w: no runs bucket", ErrDamaged)
	}
	type rewrite struct {
		id []byte
		st runState
	}
	var out []rewrite
	err := runs.ForEach(func(id, v []byte) error {
		st, err := decodeState(v)
		if err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		entries, err := runEntries(tx, string(id), st)
		if err != nil {
			return err
		}
		for i, e := range entries {
			seg, err := record.DecodeSegment(e.canon)
			if err != nil {
				return fmt.Errorf("run %s: segment %d: %w: %w", id, i, ErrDamaged, err)
			}
			st.kind = seg.Kind
			if seg.Kind == record.Resumed {
				st.idle = satAdd(st.idle, seg.IdleUJ)
			}
		}
		out = append(out, rewrite{id: append([]byte(nil), id...), st: st})
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range out {
		if err := runs.Put(r.id, r.st.encode()); err != nil {
			return err
		}
	}
	return nil
}

func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// seqKey is a log key: the sequence number, big-endian, so the log sorts
// in commit order and every commit appends at its end.
func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq) }

// A log entry is one segment of one run:
//
//	run id length (1) ‖ run id ‖ index in the run (8) ‖ sequence number
//	of the run's previous segment (8; 0 for its first) ‖ head after the
//	segment (32) ‖ the segment's canonical bytes
type logEntry struct {
	run   []byte
	index uint64
	prev  uint64
	head  record.Address
	canon []byte
}

func (e logEntry) encode() []byte {
	b := make([]byte, 0, 1+len(e.run)+48+len(e.canon))
	b = append(b, byte(len(e.run)))
	b = append(b, e.run...)
	b = binary.BigEndian.AppendUint64(b, e.index)
	b = binary.BigEndian.AppendUint64(b, e.prev)
	b = append(b, e.head[:]...)
	return append(b, e.canon...)
}

// decodeLogEntry splits an entry; canon aliases v.
func decodeLogEntry(v []byte) (logEntry, error) {
	if len(v) < 1 || len(v) < 1+int(v[0])+48+1 {
		return logEntry{}, fmt.Errorf("%w: log entry of %d bytes", ErrDamaged, len(v))
	}
	n := int(v[0])
	e := logEntry{run: v[1 : 1+n]}
	p := v[1+n:]
	e.index = binary.BigEndian.Uint64(p)
	e.prev = binary.BigEndian.Uint64(p[8:])
	e.head = record.Address(p[16:48])
	e.canon = p[48:]
	return e, nil
}
