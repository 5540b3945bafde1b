package store

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// mustStore opens a store in a temp dir; when the test ends it checks that
// every record in it verifies from genesis and every reachable object is
// intact, then closes it.
func mustStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := s.Check(); err != nil {
			t.Errorf("cleanup check: %v", err)
		}
		s.Close()
	})
	return s
}

func put(t testing.TB, s *Store, content string, refs ...record.Address) record.Address {
	t.Helper()
	a, err := s.PutBytes([]byte(content), refs...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustCreate(t testing.TB, s *Store, run string) record.Address {
	t.Helper()
	h, err := s.Create(run, record.Sum([]byte("unit "+run)), record.Sum([]byte("grants")))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestAppendAndRead(t *testing.T) {
	s := mustStore(t)
	h := mustCreate(t, s, "r1")
	att := put(t, s, "attestation 1")
	root, mem, man := put(t, s, "root"), put(t, s, "memory"), put(t, s, "manifest")
	snap := record.ImageSnapshot(root, &mem)
	for _, seg := range []record.Segment{
		record.Execution(att, nil),
		record.Suspension(snap, man),
		record.Resumption(snap, 99, record.Estimated),
	} {
		next, err := s.Append("r1", h, seg)
		if err != nil {
			t.Fatal(err)
		}
		h = next
	}
	run, err := s.Head("r1")
	if err != nil || run.Head != h || run.Len != 3 || run.Phase != record.Active {
		t.Fatalf("head %+v %v", run, err)
	}
	r, err := s.Record("r1")
	if err != nil || r.Head() != h {
		t.Fatalf("record: %v", err)
	}
	if _, err := s.Append("r1", h, record.Resumption(snap, 1, record.Estimated)); !errors.Is(err, record.ErrNotParked) {
		t.Fatalf("phase rule not applied: %v", err)
	}
	if _, err := s.Create("r1", record.Address{}, record.Address{}); !errors.Is(err, ErrRunExists) {
		t.Fatal(err)
	}
	if _, err := s.Append("nope", h, record.Execution(att, nil)); !errors.Is(err, ErrNoRun) {
		t.Fatal(err)
	}
}

func TestRefusedAppendWritesNothing(t *testing.T) {
	s := mustStore(t)
	g := mustCreate(t, s, "r")
	att := put(t, s, "att")
	h, err := s.Append("r", g, record.Execution(att, nil))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := s.Head("r")
	for name, tc := range map[string]struct {
		head record.Address
		seg  record.Segment
		want error
	}{
		"stale head":     {g, record.Execution(att, nil), ErrHeadMoved},
		"missing object": {h, record.Execution(record.Sum([]byte("absent")), nil), ErrMissingObject},
		"malformed":      {h, record.Suspension(record.Snapshot{}, att), record.ErrMalformedSnapshot},
		"not parked":     {h, record.Resumption(record.TranscriptSnapshot(att), 1, record.Estimated), record.ErrNotParked},
	} {
		if _, err := s.Append("r", tc.head, tc.seg); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", name, err, tc.want)
		}
		if after, _ := s.Head("r"); after != before {
			t.Errorf("%s: refused append changed the run", name)
		}
	}
}

func TestConcurrentWritersOneWins(t *testing.T) {
	s := mustStore(t)
	g := mustCreate(t, s, "r")
	att := put(t, s, "att")
	for round := 0; round < 20; round++ {
		run, _ := s.Head("r")
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := s.Append("r", run.Head, record.Execution(att, nil)); err == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				} else if !errors.Is(err, ErrHeadMoved) {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("round %d: %d writers succeeded on one head", round, wins)
		}
	}
	if run, _ := s.Head("r"); run.Len != 20 || run.Head == g {
		t.Fatalf("len %d", run.Len)
	}
}

func TestRunsByPhase(t *testing.T) {
	s := mustStore(t)
	att, man, tr := put(t, s, "att"), put(t, s, "man"), put(t, s, "transcript")
	for i, want := range []record.Phase{record.Active, record.Parked, record.Ended, record.Parked} {
		id := fmt.Sprintf("run-%d", i)
		h := mustCreate(t, s, id)
		h, _ = s.Append(id, h, record.Execution(att, &record.CallAccount{}))
		if want == record.Parked || want == record.Ended {
			h, _ = s.Append(id, h, record.Suspension(record.TranscriptSnapshot(tr), man))
		}
		if want == record.Ended {
			if _, err := s.Append(id, h, record.Closure("done")); err != nil {
				t.Fatal(err)
			}
		}
	}
	for p, want := range map[record.Phase]string{record.Active: "run-0", record.Parked: "run-1,run-3", record.Ended: "run-2"} {
		ids, err := s.Runs(p)
		sort.Strings(ids)
		if err != nil || strings.Join(ids, ",") != want {
			t.Errorf("%s: %v %v", p, ids, err)
		}
	}
}

func TestObjects(t *testing.T) {
	s := mustStore(t)
	a := put(t, s, "hello")
	if a != record.Sum([]byte("hello")) {
		t.Fatal("address is not the BLAKE3 of the bytes")
	}
	if b := put(t, s, "hello"); b != a {
		t.Fatal("same bytes, other address")
	}
	got, err := s.ReadAll(a)
	if err != nil || string(got) != "hello" {
		t.Fatal(err)
	}
	// A bit flip on disk.
	p := s.Path(a)
	os.Chmod(p, 0o600)
	os.WriteFile(p, []byte("hellp"), 0o400)
	_, err = s.ReadAll(a)
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Address != a || !strings.Contains(err.Error(), a.String()) {
		t.Fatalf("bit flip: %v", err)
	}
	os.WriteFile(p, []byte("hello"), 0o400)
	if _, err := s.ReadAll(record.Sum([]byte("never"))); !errors.Is(err, ErrMissingObject) {
		t.Fatal(err)
	}
	if _, err := s.PutBytes([]byte("x"), record.Sum([]byte("never"))); !errors.Is(err, ErrMissingObject) {
		t.Fatal(err)
	}
}

func TestLargeObjectStreamed(t *testing.T) {
	s := mustStore(t)
	const n = 64 << 20
	r := io.LimitReader(patternReader{}, n)
	a, err := s.Put(r)
	if err != nil {
		t.Fatal(err)
	}
	if sz, _ := s.Size(a); sz != n {
		t.Fatalf("size %d", sz)
	}
	if err := s.Verify(a); err != nil {
		t.Fatal(err)
	}
}

type patternReader struct{}

func (patternReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i * 7)
	}
	return len(p), nil
}

func writeTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDirectoryObjects(t *testing.T) {
	s := mustStore(t)
	stage, _ := s.StagingDir("criu")
	files := map[string]string{"pages-1.img": strings.Repeat("p", 10000), "core-1.img": "core", "sub/x": "core"}
	writeTree(t, stage, files)
	a, st, err := s.Ingest(stage)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 3 || st.New != 2 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := os.Stat(stage); !os.IsNotExist(err) {
		t.Fatal("staging not removed")
	}
	entries, err := s.Listing(a)
	if err != nil || len(entries) != 3 || entries[0].Name != "core-1.img" || entries[2].Name != "sub/x" || entries[0].Mode != 0o644 {
		t.Fatalf("%+v %v", entries, err)
	}
	// The address is the BLAKE3 of the canonical listing, built by hand.
	var want []byte
	want = append(want, "runrecordd.dir/1"...)
	want = append(want, 0, 0, 0, 3)
	for _, name := range []string{"core-1.img", "pages-1.img", "sub/x"} {
		c := files[name]
		fa := record.Sum([]byte(c))
		want = append(want, 0, 0, 0, byte(len(name)))
		want = append(want, name...)
		want = append(want, 0, 0, 1, 0xa4) // 0644
		want = append(want, 0, 0, 0, 0, 0, 0, byte(len(c)>>8), byte(len(c)))
		want = append(want, fa[:]...)
	}
	if a != record.Sum(want) {
		t.Fatal("directory address is not the hand-built listing's")
	}
	out := filepath.Join(t.TempDir(), "restore")
	if err := s.Materialize(a, out, true); err != nil {
		t.Fatal(err)
	}
	for name, c := range files {
		if b, _ := os.ReadFile(filepath.Join(out, name)); string(b) != c {
			t.Fatalf("%s: %q", name, b)
		}
	}
	// One flipped byte in a member file fails verification naming it.
	p := s.Path(record.Sum([]byte(files["pages-1.img"])))
	os.Chmod(p, 0o600)
	b, _ := os.ReadFile(p)
	b[5000] ^= 1
	os.WriteFile(p, b, 0o400)
	if err := s.VerifyDir(a); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pages-1.img") {
		t.Fatalf("flip: %v", err)
	}
	b[5000] ^= 1
	os.WriteFile(p, b, 0o400)
	// Symlinks are refused.
	stage2, _ := s.StagingDir("bad")
	os.Symlink("/etc/passwd", filepath.Join(stage2, "link"))
	if _, _, err := s.Ingest(stage2); err == nil {
		t.Fatal("symlink ingested")
	}
}

func TestDecodeListingStrict(t *testing.T) {
	good := EncodeListing([]Entry{{Name: "a", Size: 1}, {Name: "b", Size: 2}})
	if _, err := DecodeListing(good); err != nil {
		t.Fatal(err)
	}
	swapped := EncodeListing(nil)
	swapped = append(swapped[:len(swapped)-4], 0, 0, 0, 2)
	for _, e := range []Entry{{Name: "b"}, {Name: "a"}} {
		one := EncodeListing([]Entry{e})
		swapped = append(swapped, one[len(DirDomain)+4:]...)
	}
	for name, b := range map[string][]byte{
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"unsorted":  swapped,
		"dotdot":    EncodeListing([]Entry{{Name: "../x"}}),
		"absolute":  EncodeListing([]Entry{{Name: "/x"}}),
	} {
		if _, err := DecodeListing(b); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestGC(t *testing.T) {
	s := mustStore(t)
	h := mustCreate(t, s, "r")
	receipt, journal := put(t, s, "receipt"), put(t, s, "journal")
	att := put(t, s, "attestation", receipt, journal)
	stage, _ := s.StagingDir("img")
	writeTree(t, stage, map[string]string{"pages.img": "pages", "core.img": "core"})
	dir, _, err := s.Ingest(stage)
	if err != nil {
		t.Fatal(err)
	}
	man := put(t, s, "manifest")
	h, _ = s.Append("r", h, record.Execution(att, nil))
	if _, err := s.Append("r", h, record.Suspension(record.ImageSnapshot(dir, nil), man)); err != nil {
		t.Fatal(err)
	}
	garbage := []record.Address{put(t, s, "orphan 1"), put(t, s, "orphan 2")}
	st, err := s.GC(0)
	if err != nil {
		t.Fatal(err)
	}
	// Kept: receipt, journal, attestation, 2 files, listing, manifest.
	if st.Removed != 2 || st.Kept != 7 {
		t.Fatalf("gc %+v", st)
	}
	for _, g := range garbage {
		if s.Has(g) {
			t.Fatal("garbage kept")
		}
	}
	// A young orphan survives a grace period.
	young := put(t, s, "young")
	if st, _ := s.GC(60e9); st.Removed != 0 || !s.Has(young) {
		t.Fatalf("young orphan removed: %+v", st)
	}
}

func TestDamagedStore(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "records.db"), bytes.Repeat([]byte("garbage!"), 2048), 0o600)
	if _, err := Open(dir); !errors.Is(err, ErrDamaged) {
		t.Fatalf("garbage db: %v", err)
	}
	// A truncated real store.
	dir2 := t.TempDir()
	s, err := Open(dir2)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, "r")
	s.Close()
	p := filepath.Join(dir2, "records.db")
	b, _ := os.ReadFile(p)
	os.WriteFile(p, b[:len(b)/3], 0o600)
	if s, err := Open(dir2); err == nil {
		// Opening may succeed when the meta pages survive; reading must
		// then fail cleanly rather than panic.
		_, err = s.Check()
		s.Close()
		if err == nil {
			t.Fatal("truncated store checks clean")
		}
	}
	// Foreign files in objects/.
	dir3 := t.TempDir()
	s3, _ := Open(dir3)
	os.WriteFile(filepath.Join(dir3, "objects", "junk"), []byte("x"), 0o600)
	if _, err := s3.GC(0); !errors.Is(err, ErrDamaged) {
		t.Fatalf("junk in objects: %v", err)
	}
	s3.Close()
	// A store held by another process.
	s4, _ := Open(dir3)
	defer s4.Close()
	if _, err := Open(dir3); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("double open: %v", err)
	}
}

func TestImportVerifiedRecord(t *testing.T) {
	s := mustStore(t)
	att := put(t, s, "att")
	r := record.New(record.Sum([]byte("u")), record.Sum([]byte("g")))
	r.Append(record.Execution(att, nil))
	if err := s.Import("imported", r); err != nil {
		t.Fatal(err)
	}
	got, err := s.Record("imported")
	if err != nil || got.Head() != r.Head() {
		t.Fatal(err)
	}
	r2 := record.New(record.Sum([]byte("u")), record.Sum([]byte("g")))
	r2.Append(record.Execution(record.Sum([]byte("absent")), nil))
	if err := s.Import("other", r2); !errors.Is(err, ErrMissingObject) {
		t.Fatal(err)
	}
}
