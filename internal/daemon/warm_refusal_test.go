package daemon

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/host"
	"github.com/runrecordd/runrecordd/internal/warmpool"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// fakeCreated is a fake sandbox made and not started (forms.Created).
type fakeCreated struct{ *fakeSB }

func (fakeCreated) Begin(context.Context) error { return nil }

func (fakeCreated) Resident(context.Context) (uint64, bool, error) { return 1 << 20, false, nil }

// fakeCreator makes the warm pool's sandboxes in the fake executor.
type fakeCreator struct{ ex *fakeExec }

func (c fakeCreator) Create(_ context.Context, id string, _ executor.Spec, _ executor.Output) (forms.Created, error) {
	sb, err := c.ex.add(id)
	if err != nil {
		return nil, err
	}
	return fakeCreated{sb}, nil
}

// A resume whose Resumed segment the fleet refuses to reserve (the run was
// transferred to another host) discards the warm sandbox it took from the
// pool: no sandbox and no channel left, the record and the directory as
// they were (resume.go's reservation refusal).
func TestResumeReservationRefusedDiscardsWarm(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/warmrefused/", 5*time.Second)
	a, b := joinFleet(t, dir, "a"), joinFleet(t, dir, "b")
	pool := warmpool.New(warmpool.Config{Max: 1})
	h := newFakeHost(t, func(d *Daemon) { d.base = &host.Host{Warm: pool} })
	t.Cleanup(func() { pool.Close(context.Background()) })
	inFleet(h.d, a, nil)
	ctx := t.Context()
	h.startTranscript(t, "r")
	if _, err := h.d.Park(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	st, _ := h.d.st.Run("r")
	genesis := record.Genesis(st.Unit, st.Grants)
	// The pool makes the run's next sandbox, as a park with a call
	// pending has it do (forms.Env.WarmUp).
	var warmID string
	made := pool.Prepare("r", func(ctx context.Context) (warmpool.Entry, error) {
		spec, grants, err := h.d.st.ReadRun(st)
		if err != nil {
			return nil, err
		}
		run := forms.Run{ID: st.ID, Spec: spec, Grants: grants}
		w, err := h.d.forms.Transcript().Prepare(ctx, run, st.Parked, fakeCreator{h.ex})
		if err == nil {
			warmID = w.Sandbox()
		}
		return w, err
	}, func() bool { return true })
	if !made {
		t.Fatal("the pool made no warm sandbox")
	}
	if _, err := a.Transfer(ctx, genesis, b.Key()); err != nil {
		t.Fatal(err)
	}
	before, err := dir.Run(ctx, genesis)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Resume(ctx, "r", nil); !errors.Is(err, fleet.ErrNotOwner) {
		t.Fatalf("resume of a run transferred away: %v, want ErrNotOwner", err)
	}
	if warmID == "" || h.ex.sandbox(warmID) != nil {
		t.Fatalf("the warm sandbox %q outlived the refused resume", warmID)
	}
	if _, err := os.Stat(calls.ChannelDir(h.d.cfg.StateDir, "r")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the warm sandbox's channel is left: %v", err)
	}
	if s := pool.Stats(); s.Used != 1 || s.Ready != 0 {
		t.Fatalf("pool %+v, want its sandbox taken and none left", s)
	}
	if got := h.kinds(t, "r"); got != "executed suspended" {
		t.Fatalf("segments %s", got)
	}
	if e, err := dir.Run(ctx, genesis); err != nil || e.Head != before.Head || e.Rev != before.Rev {
		t.Fatalf("the refused resume moved the directory: %+v %v, was %+v", e, err, before)
	}
}
