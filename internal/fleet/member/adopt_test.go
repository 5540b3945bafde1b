package member

import (
	"errors"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// adopt on the host that exported the run (handed it off) is refused, and
// the handoff stays: the bundle holds the run now. A run this host owns
// and never handed off is not adopted either: the directory's owner must
// be another key whose lease is gone.
func TestAdoptOwnRunRefused(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/adopt-own/", 5*time.Second)
	a := join(t, dir, "a")
	m, st, n, rec := room(t, a, &peers{})
	hold := func() (Held, func(), error) { return &parked{}, func() {}, nil }
	if err := m.adopt(t.Context(), "r", hold); !errors.Is(err, fleet.ErrNotOwner) || n.refused.Load() != 1 {
		t.Fatalf("adopt of this host's own run: %v (%d refusals counted)", err, n.refused.Load())
	}
	if err := st.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := m.adopt(t.Context(), "r", hold); !errors.Is(err, store.ErrHandedOff) {
		t.Fatalf("adopt of a run this host exported: %v", err)
	}
	if h, off, err := st.HandedOff("r"); err != nil || !off || h.Copy || h.Head != rec.Head() {
		t.Fatalf("after the refused adopt the handoff is %+v, %v, %v", h, off, err)
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != a.Key() || e.Lease != a.Lease() {
		t.Fatalf("after the refused adopt the directory says %+v, %v", e, err)
	}
}

// A run the store holds handed off (or as a copy) is not registered in a
// directory that has no entry for it when the host starts: it is not live
// here. The same run, live, is.
func TestReconcileRegistersNoCopy(t *testing.T) {
	c := etcdtest.Shared(t)
	first := fleet.New(c.Client(t), "/register-first/", 5*time.Second)
	_, st, _, rec := room(t, join(t, first, "a"), &peers{})
	if err := st.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	dir := fleet.New(c.Client(t), "/register/", 5*time.Second)
	m := New(Config{Join: Join{Fleet: join(t, dir, "b")}, Store: st, Metrics: &counts{}, Publish: func(events.Event) {},
		Import: bundle.ImportOptions{Options: bundle.Options{Trusted: func(record.Address) bool { return true }}}})
	if _, err := m.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); !errors.Is(err, fleet.ErrNoRun) {
		t.Fatalf("a run held handed off was registered: %+v, %v", e, err)
	}
	if err := st.Reclaim("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Head != rec.Head() {
		t.Fatalf("the live run was not registered: %+v, %v", e, err)
	}
}
