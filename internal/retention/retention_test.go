package retention

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/testhost"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// closedRun makes run id parked on an image snapshot, then resumed and
// closed, and returns the snapshot's root.
func closedRun(t *testing.T, h *testhost.Fixture, id string) record.Address {
	t.Helper()
	h.Start(t, id)
	root, _ := h.DirObject(t, map[string]int{"rootfs.tar": 100 + len(id)})
	snap := record.ImageSnapshot(root, nil)
	h.Park(t, id, snap)
	h.Append(t, id, record.Resumption(snap, 1, record.Estimated), record.Closure("done"))
	return root
}

// age makes the objects at as older than any grace a test uses.
func age(t *testing.T, st *store.Store, as ...record.Address) {
	t.Helper()
	old := time.Now().Add(-3 * time.Hour)
	for _, a := range as {
		if err := os.Chtimes(st.Path(a), old, old); err != nil {
			t.Fatal(err)
		}
	}
}

// A closed run past the retention time has its snapshots released; a
// pinned one keeps them; a run closed within the retention time keeps
// them; a negative retention releases none.
func TestCollectReleasesExpiredNotPinned(t *testing.T) {
	h := testhost.New(t, "")
	log := testhost.Log(t)
	closedRun(t, h, "expired")
	closedRun(t, h, "pinned")
	if err := h.Store.Pin("pinned"); err != nil {
		t.Fatal(err)
	}
	for _, keep := range []time.Duration{-1, time.Hour} {
		res, err := Collect(t.Context(), h.Store, keep, time.Hour, log)
		if err != nil || len(res.Released) != 0 {
			t.Fatalf("keep %v: released %v, %v", keep, res.Released, err)
		}
	}
	res, err := Collect(t.Context(), h.Store, 0, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Released, []string{"expired"}) {
		t.Fatalf("released %v, want [expired]", res.Released)
	}
	for id, want := range map[string]bool{"expired": true, "pinned": false} {
		r, err := h.Store.RetentionOf(id)
		if err != nil || r.Released.IsZero() == want {
			t.Errorf("run %s: retention %+v, %v", id, r, err)
		}
	}
	// Released once: not again.
	if res, err := Collect(t.Context(), h.Store, 0, time.Hour, log); err != nil || len(res.Released) != 0 {
		t.Fatalf("second collection released %v, %v", res.Released, err)
	}
}

// Objects no record reaches stay within the grace period and go after it;
// a negative grace counts as none. Kept and removed add up.
func TestCollectHonoursGrace(t *testing.T) {
	h := testhost.New(t, "")
	log := testhost.Log(t)
	root := closedRun(t, h, "r")
	listing, err := h.Store.Listing(root)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Collect(t.Context(), h.Store, 0, time.Hour, log)
	if err != nil || !slices.Equal(res.Released, []string{"r"}) {
		t.Fatalf("released %v, %v", res.Released, err)
	}
	if res.Removed != 0 || !h.Store.Has(root) {
		t.Fatalf("removed %d objects within the grace period", res.Removed)
	}
	kept := res.Kept
	files := []record.Address{root}
	for _, e := range listing {
		files = append(files, e.Address)
	}
	age(t, h.Store, files...)
	res, err = Collect(t.Context(), h.Store, 0, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	if res.Removed != len(files) || res.RemovedBytes <= 0 || h.Store.Has(root) || res.Kept != kept-len(files) || len(res.Released) != 0 {
		t.Fatalf("after the grace period: %+v (kept %d before)", res, kept)
	}
	orphan := h.Put(t, []byte("an orphan put just now"))
	if res, err := Collect(t.Context(), h.Store, -1, time.Hour, log); err != nil || res.Removed != 0 || !h.Store.Has(orphan) {
		t.Fatalf("a young orphan: %+v, %v", res, err)
	}
	res, err = Collect(t.Context(), h.Store, -1, -time.Hour, log)
	if err != nil || res.Removed != 1 || res.RemovedBytes != int64(len("an orphan put just now")) || h.Store.Has(orphan) {
		t.Fatalf("a negative grace: %+v, %v", res, err)
	}
}

// The loop collects, goes on after a failed collection, and returns when
// its context is done; a negative interval never collects.
func TestLoop(t *testing.T) {
	log := testhost.Log(t)
	Loop(t.Context(), -1, func(context.Context) error {
		t.Fatal("collected with a negative interval")
		return nil
	}, log)

	ctx, cancel := context.WithCancel(t.Context())
	calls := make(chan int)
	done := make(chan struct{})
	n := 0
	go func() {
		defer close(done)
		Loop(ctx, time.Millisecond, func(ctx context.Context) error {
			n++
			select {
			case calls <- n:
			case <-ctx.Done(): // a collection after the test's last
			}
			return errors.New("store busy")
		}, log)
	}()
	for want := 1; want <= 3; want++ {
		if got := <-calls; got != want {
			t.Fatalf("call %d, want %d", got, want)
		}
	}
	cancel()
	<-done
}

// The configured interval and retention: 0 takes the default, anything
// else (negative: never, forever) is kept.
func TestDefaults(t *testing.T) {
	if Interval(0) != DefaultInterval || Interval(-1) != -1 || Interval(time.Second) != time.Second {
		t.Error("Interval")
	}
	if Keep(0) != DefaultKeep || Keep(-1) != -1 || Keep(time.Second) != time.Second {
		t.Error("Keep")
	}
}
