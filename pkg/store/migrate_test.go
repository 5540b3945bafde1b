package store

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// writeV1 writes a version-1 store by hand: runs and refs, no phase index.
func writeV1(t *testing.T, dir string, runs map[string]record.Phase) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "records.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		meta, _ := tx.CreateBucket(bktMeta)
		meta.Put(keyVer, binary.BigEndian.AppendUint32(nil, 1))
		tx.CreateBucket(bktRefs)
		rb, _ := tx.CreateBucket(bktRuns)
		for id, ph := range runs {
			b, _ := rb.CreateBucket([]byte(id))
			b.CreateBucket(bktSegs)
			// A record with no segments has phase executing; the v1 state
			// format is the v2 one, so only the phase byte matters here.
			st := runState{unit: record.Sum([]byte(id)), grants: record.Sum([]byte("g")), phase: ph}
			st.head = record.Genesis(st.unit, st.grants)
			if err := b.Put(keyState, encodeState(st)); err != nil {
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
	dir := t.TempDir()
	writeV1(t, dir, map[string]record.Phase{"a": record.Active, "b": record.Active})
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ids, err := s.Runs(record.Active)
	sort.Strings(ids)
	if err != nil || strings.Join(ids, ",") != "a,b" {
		t.Fatalf("phase index after migration: %v %v", ids, err)
	}
	var ver uint32
	s.db.View(func(tx *bolt.Tx) error {
		ver = binary.BigEndian.Uint32(tx.Bucket(bktMeta).Get(keyVer))
		return nil
	})
	if ver != SchemaVersion {
		t.Fatalf("version %d after migration", ver)
	}
	if _, err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bktMeta).Put(keyVer, binary.BigEndian.AppendUint32(nil, SchemaVersion+1))
	})
	s.Close()
	if _, err := Open(dir); !errors.Is(err, ErrSchema) {
		t.Fatalf("newer schema: %v", err)
	}
}

// A segment edited inside the bbolt file fails verification naming it.
func TestEditedSegmentInDB(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	h := mustCreate(t, s, "r")
	a1, a2 := put(t, s, "att 1"), put(t, s, "att 2")
	h, _ = s.Append("r", h, record.Execution(a1, nil))
	s.Append("r", h, record.Execution(a1, nil))
	s.db.Update(func(tx *bolt.Tx) error {
		segs := tx.Bucket(bktRuns).Bucket([]byte("r")).Bucket(bktSegs)
		k := binary.BigEndian.AppendUint64(nil, 1)
		v := append([]byte{}, segs.Get(k)...)
		copy(v[33:65], a2[:])
		return segs.Put(k, v)
	})
	_, err := s.Record("r")
	var se *record.SegmentError
	if !errors.As(err, &se) || se.Index != 1 || !errors.Is(err, record.ErrHeadMismatch) {
		t.Fatalf("edited segment: %v", err)
	}
	if _, err := s.Check(); err == nil {
		t.Fatal("check passed an edited record")
	}
	s.Close()
}
