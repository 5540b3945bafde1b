package store

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// parkedRun makes run parked on an image snapshot of files, with its
// evidence, and returns its head and the snapshot's listing.
func parkedRun(t *testing.T, s *Store, run string, files map[string]string) (head, listing record.Address) {
	t.Helper()
	h := mustCreate(t, s, run)
	receipt, journal := put(t, s, "receipt "+run), put(t, s, "journal "+run)
	att := put(t, s, "attestation "+run, receipt, journal)
	stage, err := s.StagingDir("img")
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, stage, files)
	dir, _, err := s.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	man := put(t, s, "manifest "+run)
	h = mustAppend(t, s, run, h, record.Execution(att, nil))
	h = mustAppend(t, s, run, h, record.Suspension(record.ImageSnapshot(dir, nil), man))
	return h, dir
}

func TestRetentionReleasesImagesOfClosedRuns(t *testing.T) {
	s := mustStore(t)
	h, dir := parkedRun(t, s, "old", map[string]string{"pages.img": "old pages", "shared.img": "shared"})
	_, dir2 := parkedRun(t, s, "live", map[string]string{"pages.img": "live pages", "shared.img": "shared"})
	listing, err := s.Listing(dir)
	if err != nil {
		t.Fatal(err)
	}
	// An open run is not released.
	if err := s.Release("old"); err == nil {
		t.Fatal("released a parked run")
	}
	r, _ := s.RetentionOf("old")
	if !r.Closed.IsZero() {
		t.Fatalf("a parked run has a close time: %+v", r)
	}
	h, err = s.Append("old", h, record.Resumption(record.ImageSnapshot(dir, nil), 1, record.Estimated))
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if _, err := s.Append("old", h, record.Closure("done")); err != nil {
		t.Fatal(err)
	}
	r, _ = s.RetentionOf("old")
	if r.Closed.Before(before.Add(-time.Second)) || r.Pinned || !r.Released.IsZero() {
		t.Fatalf("closed run's retention %+v", r)
	}
	if ex, _ := s.Expired(before.Add(-time.Hour)); len(ex) != 0 {
		t.Fatalf("expired before its time: %v", ex)
	}
	if ex, _ := s.Expired(time.Now().Add(time.Second)); len(ex) != 1 || ex[0] != "old" {
		t.Fatalf("expired %v, want [old]", ex)
	}
	// A pinned run is kept.
	if err := s.Pin("old"); err != nil {
		t.Fatal(err)
	}
	if ex, _ := s.Expired(time.Now().Add(time.Second)); len(ex) != 0 {
		t.Fatalf("a pinned run expired: %v", ex)
	}
	if err := s.Release("old"); err == nil {
		t.Fatal("released a pinned run")
	}
	if err := s.Unpin("old"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release("old"); err != nil {
		t.Fatal(err)
	}
	// Released objects younger than the grace period stay: a park of
	// another run may have just put the same bytes, to name them next.
	if st, err := s.GC(t.Context(), time.Hour); err != nil || st.Removed != 0 {
		t.Fatalf("gc within the grace period: %+v, %v", st, err)
	}
	// Past it, they go; one put again (made young) stays.
	old := time.Now().Add(-2 * time.Hour)
	for _, a := range append([]record.Address{dir}, addrs(listing)...) {
		if err := chtimes(s.Path(a), old); err != nil {
			t.Fatal(err)
		}
	}
	again := put(t, s, "old pages")
	st, err := s.GC(t.Context(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Gone: old's listing and its own pages; kept: the shared file (the
	// live run reaches it), the evidence of both runs, live's snapshot.
	if s.Has(dir) {
		t.Fatal("the released listing was kept")
	}
	for _, e := range listing {
		if want := e.Name == "shared.img" || e.Address == again; want != s.Has(e.Address) {
			t.Fatalf("after release: %s kept=%v, want %v", e.Name, s.Has(e.Address), want)
		}
	}
	if !s.Has(dir2) || st.Removed != 1 {
		t.Fatalf("gc %+v; live listing kept %v", st, s.Has(dir2))
	}
	for _, ev := range []string{"receipt old", "journal old", "attestation old", "manifest old"} {
		if !s.Has(record.Sum([]byte(ev))) {
			t.Fatalf("evidence %q removed", ev)
		}
	}
	// The store still checks: a released run's images are not reached.
	if _, err := s.Check(t.Context()); err != nil {
		t.Fatalf("check after release: %v", err)
	}
	if r, _ := s.RetentionOf("old"); r.Released.IsZero() {
		t.Fatal("no release time")
	}
	if err := s.Pin("nope"); !errors.Is(err, ErrNoRun) {
		t.Fatalf("pin of no run: %v", err)
	}
}

func TestRootsSurviveGC(t *testing.T) {
	s := mustStore(t)
	receipt, journal := put(t, s, "receipt"), put(t, s, "journal")
	att := put(t, s, "attestation never appended", receipt, journal)
	orphan := put(t, s, "orphan")
	if err := s.AddRoot(att); err != nil {
		t.Fatal(err)
	}
	if err := s.AddRoot(record.Sum([]byte("absent"))); !errors.Is(err, ErrMissingObject) {
		t.Fatalf("root of an absent object: %v", err)
	}
	if _, err := s.GC(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	for _, a := range []record.Address{att, receipt, journal} {
		if !s.Has(a) {
			t.Fatalf("rooted %s collected", a)
		}
	}
	if s.Has(orphan) {
		t.Fatal("orphan kept")
	}
	if _, err := s.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func addrs(es []Entry) []record.Address {
	out := make([]record.Address, len(es))
	for i, e := range es {
		out[i] = e.Address
	}
	return out
}

// An object adopted from a file staged long ago is young from its
// adoption: a GC between the adoption and the record that names it (an
// import) leaves it.
func TestAdoptedObjectIsYoung(t *testing.T) {
	s := mustStore(t)
	stage, err := s.StagingDir("import")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(stage, "obj")
	if err := os.WriteFile(p, []byte("staged two hours ago"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := chtimes(p, time.Now().Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	a, err := s.Adopt(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(t.Context(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if !s.Has(a) {
		t.Fatal("GC removed an object adopted a moment ago")
	}
}
