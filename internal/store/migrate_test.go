package store

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// writeV1 writes a version-1 store by hand — meta, run states, the log of
// segments, refs; no phase index — holding the given records, with every
// object they name.
// recordsOf makes a record of each run from its segments (its unit and
// grants from unitOf).
func recordsOf(t *testing.T, runs map[string][]record.Segment) map[string]*record.Record {
	t.Helper()
	recs := map[string]*record.Record{}
	for id, segs := range runs {
		u, g := unitOf(id)
		r := record.New(u, g)
		for _, seg := range segs {
			if _, err := r.Append(seg); err != nil {
				t.Fatal(err)
			}
		}
		recs[id] = r
	}
	return recs
}

func writeV1(t *testing.T, dir string, records map[string]*record.Record, objects []string) {
	t.Helper()
	s, err := Open(dir) // for the objects directory and its files
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objects {
		put(t, s, o)
	}
	s.Close()
	os.Remove(filepath.Join(dir, "records.db"))
	db, err := bolt.Open(filepath.Join(dir, "records.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		meta, _ := tx.CreateBucket([]byte("meta"))
		meta.Put([]byte("version"), []byte{0, 0, 0, 1})
		tx.CreateBucket([]byte("refs"))
		runs, _ := tx.CreateBucket([]byte("runs"))
		log, _ := tx.CreateBucket([]byte("log"))
		for id, r := range records {
			// Log entries, byte by byte: run id length, run id, index,
			// previous entry, head, canonical segment.
			var last uint64
			for i := range r.Len() {
				seq, _ := log.NextSequence()
				v := append([]byte{byte(len(id))}, id...)
				v = binary.BigEndian.AppendUint64(v, uint64(i))
				v = binary.BigEndian.AppendUint64(v, last)
				h := r.HeadAt(i)
				v, _ = r.Segment(i).AppendCanonical(append(v, h[:]...))
				log.Put(binary.BigEndian.AppendUint64(nil, seq), v)
				last = seq
			}
			// The state: format 1, unit, grants, head, count, phase, last.
			st := []byte{1}
			u, g, head := r.Unit(), r.Grants(), r.Head()
			st = append(append(append(st, u[:]...), g[:]...), head[:]...)
			st = binary.BigEndian.AppendUint64(st, uint64(r.Len()))
			st = append(st, byte(r.Phase()))
			st = binary.BigEndian.AppendUint64(st, last)
			if err := runs.Put([]byte(id), st); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Migration 1→2 builds the phase index from the run states.
func TestMigration1To2(t *testing.T) {
	att, tr, man := record.Sum([]byte("att")), record.Sum([]byte("transcript")), record.Sum([]byte("manifest"))
	recs := recordsOf(t, map[string][]record.Segment{
		"fresh":    nil,
		"running":  {record.Execution(att, nil)},
		"parked":   {record.Execution(att, nil), record.Suspension(record.TranscriptSnapshot(tr), man)},
		"parked-2": {record.Execution(att, nil), record.Execution(att, nil), record.Suspension(record.TranscriptSnapshot(tr), man)},
		"closed":   {record.Execution(att, nil), record.Closure("done")},
		"resumed":  {record.Execution(att, nil), record.Suspension(record.TranscriptSnapshot(tr), man), record.Resumption(record.TranscriptSnapshot(tr), 3, record.Measured)},
	})
	dir := t.TempDir()
	writeV1(t, dir, recs, []string{"att", "transcript", "manifest"})
	s := mustOpen(t, dir)
	for p, want := range map[record.Phase][]string{
		record.PhaseExecuting: {"fresh", "resumed", "running"},
		record.PhaseParked:    {"parked", "parked-2"},
		record.PhaseClosed:    {"closed"},
	} {
		if ids, err := s.Runs(p); err != nil || !slices.Equal(ids, want) {
			t.Errorf("%s after migration: %v %v, want %v", p, ids, err, want)
		}
	}
	if last := migrations[len(migrations)-1].to; SchemaVersion != last {
		t.Fatalf("SchemaVersion %d, last migration to %d", SchemaVersion, last)
	}
	if v := schemaVersion(t, s); v != SchemaVersion {
		t.Fatalf("version %d after migration", v)
	}
	// The migrated store works on: the index follows new appends.
	mustAppend(t, s, "parked", recs["parked"].Head(), record.Resumption(record.TranscriptSnapshot(tr), 1, record.Estimated))
	if ids, _ := s.Runs(record.PhaseParked); !slices.Equal(ids, []string{"parked-2"}) {
		t.Fatalf("parked after resume: %v", ids)
	}
	// Reopening does not migrate again.
	s = mustReopen(t, s)
	if v := schemaVersion(t, s); v != SchemaVersion {
		t.Fatalf("version %d", v)
	}
}

// Migration 4→5 gives every run state its last segment's kind and its
// idle total, so the rules that need them judge a migrated run as a new one.
func TestMigrationStateFormat2(t *testing.T) {
	att, tr, man := record.Sum([]byte("att")), record.Sum([]byte("transcript")), record.Sum([]byte("manifest"))
	ts := record.TranscriptSnapshot(tr)
	recs := recordsOf(t, map[string][]record.Segment{
		"fresh":   nil,
		"resumed": {record.Execution(att, nil), record.Suspension(ts, man), record.Resumption(ts, 3, record.Measured)},
		"twice": {record.Execution(att, nil), record.Suspension(ts, man), record.Resumption(ts, 3, record.Measured),
			record.Execution(att, nil), record.Suspension(ts, man), record.Resumption(ts, 4, record.Estimated), record.Execution(att, nil)},
	})
	dir := t.TempDir()
	writeV1(t, dir, recs, []string{"att", "transcript", "manifest"})
	s := mustOpen(t, dir)
	for id, want := range map[string]struct {
		last record.Kind
		idle uint64
	}{"fresh": {0, 0}, "resumed": {record.Resumed, 3}, "twice": {record.Executed, 7}} {
		r, err := s.Run(id)
		if err != nil || r.Last != want.last || r.IdleUJ != want.idle {
			t.Errorf("%s after migration: last %s, idle %d (%v); want %s, %d", id, r.Last, r.IdleUJ, err, want.last, want.idle)
		}
	}
	// A resumed run may not park without an interval; one that executed may.
	if _, err := s.Append("resumed", recs["resumed"].Head(), record.Suspension(ts, man)); !errors.Is(err, record.ErrAlternation) {
		t.Fatalf("park right after a resume: %v", err)
	}
	h := mustAppend(t, s, "twice", recs["twice"].Head(), record.Suspension(ts, man))
	mustAppend(t, s, "twice", h, record.Resumption(ts, 5, record.Measured))
	if r, _ := s.Run("twice"); r.IdleUJ != 12 || r.Last != record.Resumed {
		t.Fatalf("after a resume: idle %d, last %s", r.IdleUJ, r.Last)
	}
}

// Migration 3→4 creates the trust bucket, empty; keys trusted after it
// persist.
func TestMigrationToTrust(t *testing.T) {
	dir := t.TempDir()
	writeV1(t, dir, map[string]*record.Record{"r": record.New(unitOf("r"))}, nil)
	s := mustOpen(t, dir)
	if keys, err := s.TrustedKeys(); err != nil || len(keys) != 0 {
		t.Fatalf("trusted keys after migration: %v %v", keys, err)
	}
	a, b := record.Sum([]byte("a")), record.Sum([]byte("b"))
	if err := s.Trust(a, "host a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Trust(b, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Untrust(b); err != nil {
		t.Fatal(err)
	}
	if err := s.Untrust(b); !errors.Is(err, ErrNotTrusted) {
		t.Fatalf("untrust twice: %v", err)
	}
	if err := s.Trust(a, string([]byte{0xff})); !errors.Is(err, ErrKeyName) {
		t.Fatalf("a name that is not UTF-8: %v", err)
	}
	s = mustReopen(t, s)
	keys, err := s.TrustedKeys()
	if err != nil || len(keys) != 1 || keys[0] != (TrustedKey{Key: a, Name: "host a"}) || !s.IsTrusted(a) || s.IsTrusted(b) {
		t.Fatalf("trusted keys after reopen: %v %v", keys, err)
	}
}

// A migration that fails leaves the store at its old version, untouched.
func TestMigrationFailureRollsBack(t *testing.T) {
	dir := t.TempDir()
	writeV1(t, dir, map[string]*record.Record{"r": record.New(unitOf("r"))}, nil)
	db, _ := bolt.Open(filepath.Join(dir, "records.db"), 0o600, nil)
	db.Update(func(tx *bolt.Tx) error { // a state the migration cannot read
		return tx.Bucket(bktRuns).Put([]byte("r"), []byte("short"))
	})
	db.Close()
	if _, err := Open(dir); !errors.Is(err, ErrDamaged) {
		t.Fatalf("migration over a damaged state: %v", err)
	}
	db, _ = bolt.Open(filepath.Join(dir, "records.db"), 0o600, nil)
	defer db.Close()
	db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktMeta).Get(keyVer); binary.BigEndian.Uint32(v) != 1 || tx.Bucket(bktPhases) != nil {
			t.Error("failed migration left its changes")
		}
		return nil
	})
}

func schemaVersion(t *testing.T, s *Store) uint32 {
	t.Helper()
	var v uint32
	s.view(func(tx *bolt.Tx) error {
		v = binary.BigEndian.Uint32(tx.Bucket(bktMeta).Get(keyVer))
		return nil
	})
	return v
}

func TestNewerSchemaRefused(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	s.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bktMeta).Put(keyVer, binary.BigEndian.AppendUint32(nil, SchemaVersion+1))
	})
	s.Close()
	if _, err := Open(dir); !errors.Is(err, ErrSchema) {
		t.Fatalf("newer schema: %v", err)
	}
}
