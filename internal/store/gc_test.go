package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestGC(t *testing.T) {
	s := mustStore(t)
	h := mustCreate(t, s, "r")
	receipt, journal := put(t, s, "receipt"), put(t, s, "journal")
	att := put(t, s, "attestation", receipt, journal)
	stage, _ := s.StagingDir("img")
	writeTree(t, stage, map[string]string{"pages.img": "pages", "core.img": "core"})
	dir, _, err := s.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	man := put(t, s, "manifest")
	h = mustAppend(t, s, "r", h, record.Execution(att, nil))
	mustAppend(t, s, "r", h, record.Suspension(record.ImageSnapshot(dir, nil), man))
	// Orphans: never named, or named only by an orphan.
	leaf := put(t, s, "orphan leaf")
	garbage := []record.Address{put(t, s, "orphan 1"), leaf, put(t, s, "orphan 2", leaf)}
	st, err := s.GC(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	// Live: receipt, journal, attestation, 2 files, the listing, manifest.
	if st.Removed != 3 || st.Live != 7 || st.Young != 0 || st.Kept() != 7 || st.RemovedBytes != int64(len("orphan 1orphan leaforphan 2")) {
		t.Fatalf("gc %+v", st)
	}
	for _, g := range garbage {
		if s.Has(g) {
			t.Fatalf("garbage %s kept", g)
		}
	}
	if refs, _ := s.Refs(garbage[2]); len(refs) != 0 {
		t.Fatal("a removed object's refs were kept")
	}
	// A young orphan survives a grace period; putting an old one again
	// makes it young.
	young := put(t, s, "young")
	if st, _ := s.GC(t.Context(), time.Minute); st.Removed != 0 || st.Young != 1 || !s.Has(young) {
		t.Fatalf("young orphan removed: %+v", st)
	}
	old := time.Now().Add(-time.Hour)
	if err := chtimes(s.Path(young), old); err != nil {
		t.Fatal(err)
	}
	put(t, s, "young")
	if st, _ := s.GC(t.Context(), time.Minute); st.Removed != 0 {
		t.Fatalf("re-put object removed: %+v", st)
	}
	// A GC over a record that does not verify collects nothing.
	restore := editSegment(t, s, "r", 0, func(v []byte) []byte { v[0] ^= 1; return v })
	orphan := put(t, s, "orphan 3")
	if _, err := s.GC(t.Context(), 0); err == nil || !s.Has(orphan) {
		t.Fatalf("gc ran over a record that does not verify: %v", err)
	}
	restore()
}

// GC racing appends and puts never leaves a segment naming a missing
// object: an append either sees its objects or is refused.
func TestGCRacingAppends(t *testing.T) {
	s := mustStore(t)
	const writers = 4
	var wg sync.WaitGroup
	var appended, refused atomic.Int64
	stop := make(chan struct{})
	for w := range writers {
		id := fmt.Sprintf("w%d", w)
		h := mustCreate(t, s, id)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				att, err := s.PutBytes(fmt.Appendf(nil, "%s attestation %d", id, i))
				if err != nil {
					t.Error(err)
					return
				}
				next, err := s.Append(id, h, record.Execution(att, nil))
				switch {
				case err == nil:
					h = next
					appended.Add(1)
				case errors.Is(err, ErrMissingObject): // collected before it was named
					refused.Add(1)
				default:
					t.Error(err)
					return
				}
			}
		})
	}
	for range 30 {
		if _, err := s.GC(t.Context(), 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if appended.Load() == 0 {
		t.Fatal("no append got through")
	}
	t.Logf("%d appends, %d refused for a collected object", appended.Load(), refused.Load())
}

// A run's unit and grants, when stored as objects, are roots; a run
// without them is no error.
func TestGCKeepsUnitAndGrants(t *testing.T) {
	s := mustStore(t)
	spec, grants := put(t, s, "canonical spec"), put(t, s, "canonical grants")
	if _, err := s.Create("with", spec, grants); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, "without") // unitOf's ids name no stored object
	orphan := put(t, s, "orphan")
	st, err := s.GC(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Live != 2 || st.Removed != 1 || !s.Has(spec) || !s.Has(grants) || s.Has(orphan) {
		t.Fatalf("gc %+v", st)
	}
	cs, err := s.Check(t.Context())
	if err != nil || cs.Objects != 2 || cs.Runs != 2 {
		t.Fatalf("check %+v %v", cs, err)
	}
	// Stored and then damaged, a unit object fails the check.
	damage(t, s, spec, flipByte(0))
	if _, err := s.Check(t.Context()); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("check over a damaged unit object: %v", err)
	}
	damage(t, s, spec, flipByte(0))
}
