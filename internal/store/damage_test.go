package store

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// populated returns the directory of a closed store holding a few runs
// with segments of every kind, and the objects they name.
func populated(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	for _, id := range []string{"a", "b", "c", "d"} {
		h := mustCreate(t, s, id)
		for range 20 {
			h = mustAppend(t, s, id, h, record.Execution(att, &record.CallAccount{Dispatched: []string{"x"}}))
		}
		if id != "a" {
			h = mustAppend(t, s, id, h, record.Suspension(record.TranscriptSnapshot(tr), man))
		}
		if id == "c" {
			mustAppend(t, s, id, h, record.Closure(strings.Repeat("reason ", 100)))
		}
	}
	if _, err := s.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	return dir
}

// withDB returns a new store directory holding dir's objects and db as
// its bbolt file. (A file that made bbolt panic inside its Open stays
// locked by this process, so each damaged file gets a directory of its own.)
func withDB(t *testing.T, dir string, db []byte) string {
	t.Helper()
	out := t.TempDir()
	err := filepath.WalkDir(filepath.Join(dir, "objects"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(out, rel), 0o700)
		}
		return os.Link(p, filepath.Join(out, rel))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "records.db"), db, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// openAndCheck opens dir and checks it, reporting an error from either;
// a panic fails the test.
func openAndCheck(t *testing.T, dir string) error {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("panic: %v", r)
		}
	}()
	s, err := Open(dir)
	if err != nil {
		return err
	}
	defer s.Close()
	for _, id := range []string{"a", "b", "c", "d"} {
		s.Run(id)
		s.Record(id)
	}
	_, err = s.Check(t.Context())
	return err
}

func TestDamagedBoltFile(t *testing.T) {
	dir := populated(t)
	good, _ := os.ReadFile(filepath.Join(dir, "records.db"))
	// Garbage where the bbolt file should be.
	if err := openAndCheck(t, withDB(t, dir, bytes.Repeat([]byte("garbage!"), 4096))); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "records.db") {
		t.Fatalf("garbage: %v", err)
	}
	// Emptied, beside objects: not silently a new store.
	if err := openAndCheck(t, withDB(t, dir, nil)); !errors.Is(err, ErrDamaged) {
		t.Fatalf("emptied: %v", err)
	}
	// Truncated at many lengths short of the pages in use. (bbolt grows
	// its file ahead of use; cutting only the unused tail is no damage.)
	used := usedLength(t, filepath.Join(dir, "records.db"))
	for _, n := range []int{1, 100, 4096, 4096 * 2, 4096*2 + 17, used / 3, used / 2, used - 4096, used - 1} {
		err := openAndCheck(t, withDB(t, dir, good[:n]))
		if !errors.Is(err, ErrDamaged) {
			t.Errorf("truncated to %d of %d bytes in use: %v", n, used, err)
		}
	}
	if err := openAndCheck(t, withDB(t, dir, good[:used])); err != nil {
		t.Errorf("unused tail cut: %v", err)
	}
	if err := openAndCheck(t, dir); err != nil {
		t.Fatalf("the original: %v", err)
	}
}

// usedLength is the bytes of a bbolt file its pages occupy.
func usedLength(t *testing.T, path string) int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int64
	db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	return int(n)
}

// Single-byte damage anywhere in the bbolt file: opening and checking
// return an error or find nothing wrong (the byte was unused), and never
// panic. Every page is hit, at deterministic pseudo-random offsets.
func TestBoltFileByteFlips(t *testing.T) {
	dir := populated(t)
	good, _ := os.ReadFile(filepath.Join(dir, "records.db"))
	rng := rand.New(rand.NewSource(7))
	caught, unused := 0, 0
	for page := 0; page < len(good)/4096; page++ {
		for range 3 {
			b := bytes.Clone(good)
			b[page*4096+rng.Intn(4096)] ^= byte(1 << rng.Intn(8))
			if err := openAndCheck(t, withDB(t, dir, b)); err != nil {
				caught++
			} else {
				unused++
			}
		}
	}
	t.Logf("%d pages: %d flips caught, %d in unused bytes", len(good)/4096, caught, unused)
	if caught == 0 {
		t.Fatal("no flip was caught")
	}
}

func TestDamagedSegments(t *testing.T) {
	dir := populated(t)
	s := mustOpen(t, dir)
	for _, tc := range []struct {
		name string
		edit func(v []byte) []byte
		want error
	}{
		{"edited", func(v []byte) []byte { v[33] ^= 1; return v }, record.ErrHeadMismatch},
		{"stored head", func(v []byte) []byte { v[0] ^= 1; return v }, record.ErrHeadMismatch},
		{"half-written", func(v []byte) []byte { return v[:len(v)-3] }, ErrDamaged},
		{"short", func(v []byte) []byte { return v[:10] }, ErrDamaged},
		{"trailing", func(v []byte) []byte { return append(v, 0) }, ErrDamaged},
	} {
		restore := editSegment(t, s, "b", 7, tc.edit)
		_, err := s.Record("b")
		var se *record.SegmentError
		if !errors.Is(err, tc.want) || !errors.As(err, &se) || se.Index != 7 || !strings.Contains(err.Error(), "run b") {
			t.Errorf("%s: %v", tc.name, err)
		}
		if _, err := s.Check(t.Context()); !errors.Is(err, tc.want) {
			t.Errorf("%s: check: %v", tc.name, err)
		}
		restore()
	}
	// A lost segment; a log entry moved to another run's chain; an entry
	// no record reaches.
	var seq uint64
	var entry []byte
	s.commit(func(tx *bolt.Tx) error {
		seq = segmentSeq(t, tx, "a", 12)
		entry = bytes.Clone(tx.Bucket(bktLog).Get(seqKey(seq)))
		return tx.Bucket(bktLog).Delete(seqKey(seq))
	})
	var se *record.SegmentError
	if _, err := s.Record("a"); !errors.Is(err, ErrDamaged) || !errors.As(err, &se) || se.Index != 12 {
		t.Errorf("lost segment: %v", err)
	}
	s.commit(func(tx *bolt.Tx) error {
		other := bytes.Clone(tx.Bucket(bktLog).Get(seqKey(segmentSeq(t, tx, "b", 12))))
		return tx.Bucket(bktLog).Put(seqKey(seq), other)
	})
	if _, err := s.Record("a"); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "run \"b\"") {
		t.Errorf("another run's entry: %v", err)
	}
	s.commit(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bktLog).Put(seqKey(seq), entry); err != nil {
			return err
		}
		return tx.Bucket(bktLog).Put(seqKey(1<<40), entry)
	})
	if _, err := s.Check(t.Context()); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "log holds") {
		t.Errorf("stray log entry: %v", err)
	}
	s.commit(func(tx *bolt.Tx) error { return tx.Bucket(bktLog).Delete(seqKey(1 << 40)) })
	// A phase index that disagrees with a run's state.
	s.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bktPhases).Bucket(phaseKeys[record.PhaseClosed]).Put([]byte("a"), nil)
	})
	if _, err := s.Check(t.Context()); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "run a") {
		t.Errorf("phase index: %v", err)
	}
	s.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bktPhases).Bucket(phaseKeys[record.PhaseClosed]).Delete([]byte("a"))
	})
}

func TestDamagedObjects(t *testing.T) {
	// An object a record names, gone: Check names it.
	dir := populated(t)
	tr := record.Sum([]byte("transcript"))
	s := mustOpen(t, dir)
	p := s.Path(tr)
	b, _ := os.ReadFile(p)
	os.Remove(p)
	if _, err := s.Check(t.Context()); !errors.Is(err, ErrMissingObject) || !strings.Contains(err.Error(), tr.String()) {
		t.Fatalf("missing object: %v", err)
	}
	os.WriteFile(p, []byte("transcripT"), 0o400)
	if _, err := s.Check(t.Context()); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tr.String()) {
		t.Fatalf("corrupt object: %v", err)
	}
	os.Chmod(p, 0o600)
	os.WriteFile(p, b, 0o400)
	// Strays in objects/ are damage, not objects.
	for _, stray := range []string{"junk", "A/not-an-address", "AB"} {
		q := filepath.Join(dir, "objects", stray)
		os.WriteFile(q, []byte("x"), 0o600)
		if _, err := s.GC(t.Context(), 0); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), stray) {
			t.Errorf("stray %s: %v", stray, err)
		}
		os.Remove(q)
	}
	s.Close()

	// The objects directory missing, or not a directory.
	objects := filepath.Join(dir, "objects")
	os.Rename(objects, objects+".away")
	if _, err := Open(dir); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "objects") {
		t.Fatalf("objects missing: %v", err)
	}
	os.WriteFile(objects, []byte("x"), 0o600)
	if _, err := Open(dir); !errors.Is(err, ErrDamaged) {
		t.Fatalf("objects a file: %v", err)
	}
	os.Remove(objects)
	os.Rename(objects+".away", objects)
	if err := openAndCheck(t, dir); err != nil {
		t.Fatal(err)
	}
}

func TestLockedStore(t *testing.T) {
	s := mustStore(t)
	if _, err := Open(s.Dir()); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
	// The failed open did not touch the open store's work in progress.
	stage, _ := s.StagingDir("busy")
	Open(s.Dir())
	if _, err := os.Stat(stage); err != nil {
		t.Fatal("a refused open cleared the store's staging")
	}
	os.Remove(stage)
}
