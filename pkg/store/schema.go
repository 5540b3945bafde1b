package store

import (
	"encoding/binary"
	"fmt"

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
	keyVer    = []byte("version")
)

// phaseKeys name the phase index's buckets, by [record.Phase].
var phaseKeys = [...][]byte{
	record.Active: []byte("executing"),
	record.Parked: []byte("parked"),
	record.Ended:  []byte("closed"),
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
}

// SchemaVersion is the version this package writes: the last migration's
// (a test holds the two together).
const SchemaVersion = 4

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
		if st.phase == record.Ended {
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
}

const (
	stateFormat = 1
	stateLen    = 1 + 32 + 32 + 32 + 8 + 1 + 8
)

// encode: format (1 byte, 1) ‖ unit id (32) ‖ grants id (32) ‖ head (32)
// ‖ segment count (8) ‖ phase (1: 0 executing, 1 parked, 2 closed) ‖ last
// segment's sequence number (8). Integers are big-endian.
func (st runState) encode() []byte {
	b := make([]byte, 0, stateLen)
	b = append(b, stateFormat)
	b = append(b, st.unit[:]...)
	b = append(b, st.grants[:]...)
	b = append(b, st.head[:]...)
	b = binary.BigEndian.AppendUint64(b, st.n)
	b = append(b, byte(st.phase))
	return binary.BigEndian.AppendUint64(b, st.last)
}

func decodeState(b []byte) (runState, error) {
	var st runState
	if len(b) != stateLen || b[0] != stateFormat || b[105] > byte(record.Ended) {
		return st, fmt.Errorf("%w: run state of %d bytes is not format %d", ErrDamaged, len(b), stateFormat)
	}
	copy(st.unit[:], b[1:33])
	copy(st.grants[:], b[33:65])
	copy(st.head[:], b[65:97])
	st.n = binary.BigEndian.Uint64(b[97:105])
	st.phase = record.Phase(b[105])
	st.last = binary.BigEndian.Uint64(b[106:114])
	if (st.n == 0) != (st.last == 0) {
		return st, fmt.Errorf("%w: run state of %d segments with last sequence number %d", ErrDamaged, st.n, st.last)
	}
	return st, nil
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
