package daemon

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
)

// A bundle imported on a host in a fleet makes the run that host's when
// the directory allows it — a run from outside the fleet (no entry), or
// one whose owner is gone — and otherwise is stored there but inert (the
// fence refuses its advances: a close is refused not_owner, nothing
// appended), saying which host's refusal kept it: never two owners.
func TestFleetImportClaims(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/import/", 5*time.Second)
	a, b, z := joinFleet(t, dir, "a"), joinFleet(t, dir, "b"), joinFleet(t, dir, "z")
	bun := forgeRun(t, nil)
	rec := bun.Record
	var last *Daemon
	// postOn posts a result for the run's outstanding call on the host
	// that imported it last: refused (not_owner) unless it owns the run.
	postOn := func(*fleet.Session) error {
		_, err := last.PostResult(t.Context(), "r", "c1", []byte(`{}`))
		if err != nil && !errors.Is(err, fleet.ErrNotOwner) {
			t.Fatalf("post: %v", err)
		}
		return err
	}
	importOn := func(h *fleet.Session) answers.Imported {
		t.Helper()
		m := importHost(t)
		inFleet(m.d, h, nil)
		im, err := m.d.ImportWith(t.Context(), bytes.NewReader(bun.Tar(nil)), "", false)
		if err != nil {
			t.Fatal(err)
		}
		last = m.d
		if im.Unclaimed != nil {
			if _, err := m.d.Close(t.Context(), "r", ""); !errors.Is(err, fleet.ErrNotOwner) {
				t.Fatalf("close of a run another host owns: %v", err)
			}
			if head, _ := m.d.st.Head("r"); head != rec.Head() {
				t.Fatal("a refused close appended")
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
	if im := importOn(a); im.Unclaimed != nil {
		t.Fatalf("first import: %+v", im)
	}
	if e := owner(); e.Owner != a.Key() || e.Head != rec.Head() || e.Phase != rec.Phase() {
		t.Fatalf("entry %+v", e)
	}
	// a is alive: b stores it, inert, and says why.
	im := importOn(b)
	if !errors.Is(im.Unclaimed, fleet.ErrNotOwner) || postOn(b) == nil {
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
	if im := importOn(z); im.Unclaimed != nil {
		t.Fatalf("import after a is gone: %+v", im)
	}
	if e := owner(); e.Owner != z.Key() {
		t.Fatalf("entry %+v after z's import", e)
	}
}
