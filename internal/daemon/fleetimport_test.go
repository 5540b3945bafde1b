package daemon

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/store"
)

// A bundle imported on a host in a fleet makes the run that host's when
// the directory allows it — a run from outside the fleet (no entry), or
// one whose owner is gone — and otherwise is held there handed off (not
// resumable), saying which host's refusal kept it: never two owners.
func TestFleetImportClaims(t *testing.T) {
	c := etcdtest.Start(t)
	dir := fleet.New(c.Client(t), "/import/", 5*time.Second)
	a, b, z := joinFleet(t, dir, "a"), joinFleet(t, dir, "b"), joinFleet(t, dir, "z")
	bun := forgeRun(t, nil)
	rec := bun.Record
	importOn := func(h *fleet.Host) Imported {
		t.Helper()
		m := importHost(t)
		m.d.cfg.Fleet = h
		im, err := m.d.ImportWith(t.Context(), bytes.NewReader(bun.Tar(nil)), "", false)
		if err != nil {
			t.Fatal(err)
		}
		if im.Unclaimed != nil {
			if _, err := m.d.Resume(t.Context(), "r"); !errors.Is(err, store.ErrHandedOff) {
				t.Fatalf("resume of a run held handed off: %v", err)
			}
		}
		return im
	}
	owner := func() fleet.Entry {
		t.Helper()
		e, err := dir.Run(t.Context(), rec.Genesis())
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	// From outside the fleet: claimed at the record's head.
	if im := importOn(a); im.Unclaimed != nil || im.Run.HandedOff {
		t.Fatalf("first import: %+v", im)
	}
	if e := owner(); e.Owner != a.Key() || e.Head != rec.Head() || e.Phase != rec.Phase() {
		t.Fatalf("entry %+v", e)
	}
	// a is alive: b holds it handed off, and says why.
	im := importOn(b)
	if !errors.Is(im.Unclaimed, fleet.ErrNotOwner) || !im.Run.HandedOff {
		t.Fatalf("import while a owns it: %+v", im)
	}
	if e := owner(); e.Owner != a.Key() {
		t.Fatalf("entry %+v after b's import", e)
	}
	// a is gone: z takes it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if im := importOn(z); im.Unclaimed != nil || im.Run.HandedOff {
		t.Fatalf("import after a is gone: %+v", im)
	}
	if e := owner(); e.Owner != z.Key() {
		t.Fatalf("entry %+v after z's import", e)
	}
}
