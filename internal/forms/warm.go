package forms

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/warmpool"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Creator makes sandboxes whose task is created and not started
// (*executor.Client's Create, through Creates): a warm sandbox's.
type Creator interface {
	Create(ctx context.Context, id string, spec executor.Spec, out executor.Output) (Created, error)
}

// Created is a sandbox made and not started (*executor.Sandbox).
type Created interface {
	Sandbox
	// Begin starts the unit's process.
	Begin(ctx context.Context) error
	// Resident is the memory it holds on the host, and whether its
	// shim's is counted.
	Resident(ctx context.Context) (bytes uint64, shim bool, err error)
}

// Creates is the executor as a Creator.
func Creates(c *executor.Client) Creator { return execCreator{c} }

type execCreator struct{ c *executor.Client }

func (e execCreator) Create(ctx context.Context, id string, spec executor.Spec, out executor.Output) (Created, error) {
	sb, err := e.c.Create(ctx, id, spec, out)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// Warm is the sandbox of a parked transcript run's next interval, made
// ahead of its resume (Transcript.Prepare) exactly as Wake would make it:
// the channel directory with the sealed transcript restored and its
// socket listening, and the sandbox over it with its task created, not
// started. A Wake given it starts the task (docs/warm-pool.md).
type Warm struct {
	run  Run
	spec executor.Spec  // the spec it was made with
	snap record.Address // the sealed transcript it holds
	ch   *calls.Channel
	sb   Created
}

// Run is the run the sandbox is for.
func (w *Warm) Run() string { return w.run.ID }

// Sandbox is the sandbox's id.
func (w *Warm) Sandbox() string { return w.sb.ID() }

// Resident is the memory the sandbox holds while it waits.
func (w *Warm) Resident(ctx context.Context) (uint64, error) {
	n, _, err := w.sb.Resident(ctx)
	return n, err
}

// Discard removes the sandbox, then its channel.
func (w *Warm) Discard(ctx context.Context) error {
	err := w.sb.Destroy(ctx)
	w.ch.Close()
	return err
}

// WarmUp has the warm pool make, behind a park's reply, the sandbox of
// parked run id's next interval as its Wake would make it (Prepare), when
// snap is a transcript and a posted result can wake the run (Pending);
// keep says, at each of the pool's sweeps, whether the run is still
// parked and held here (not closed, handed off or migrated).
func (h Env) WarmUp(id string, snap record.Snapshot, keep func() bool) {
	if !h.Warm.Enabled() || !snap.IsTranscript() || !h.Pending(id) {
		return
	}
	build := func(ctx context.Context) (warmpool.Entry, error) {
		st, err := h.Store.Run(id)
		if err != nil {
			return nil, err
		}
		spec, grants, err := h.Store.ReadRun(st) // as the resume's admission reads it
		if err != nil {
			return nil, err
		}
		return h.Transcript().Prepare(ctx, Run{ID: id, Spec: spec, Grants: grants}, snap, h.Creates)
	}
	h.Warm.Prepare(id, build, keep)
}

// TakeWarm is the warm sandbox made for run id's wake, if the pool holds
// one (a transcript unit's only), and what the pool held for the run
// meanwhile: its warm-pool residency, which the resume owes with the
// park's. It is taken only once the resume is admitted.
func (h Env) TakeWarm(id string, mode unit.Mode) (*Warm, idle.Residency) {
	if mode != unit.TranscriptMode {
		return nil, idle.Residency{}
	}
	entry, residency := h.Warm.Take(id)
	w, _ := entry.(*Warm)
	return w, residency
}

// Transcript is the transcript form of h.
func (h Env) Transcript() Transcript { return Transcript{h} }

// Pending reports whether parked run id has calls a posted result can
// resolve (outstanding, or with a result posted and not yet delivered):
// a run whose next interval a warm sandbox may serve.
func (h Env) Pending(id string) bool {
	l, err := h.Store.Calls(id)
	if err != nil {
		return false
	}
	for _, c := range l.Calls {
		if c.State != store.CallResolved {
			return true
		}
	}
	return false
}

// Prepare makes the sandbox of run's next interval, parked in snap, as
// Wake would make it now — the same channel directory, transcript, spec,
// limits, mounts, output and sandbox id — with its task created and not
// started, through cr. The caller holds no channel of the run open (the
// last interval's is closed: it has the same directory).
func (f Transcript) Prepare(ctx context.Context, run Run, snap record.Snapshot, cr Creator) (*Warm, error) {
	if !snap.IsTranscript() {
		return nil, fmt.Errorf("warm %s: %w", run.ID, ErrFormMismatch)
	}
	ch, err := f.open(run.ID, snap.Transcript, run.Grants.Limits)
	if err != nil {
		return nil, err
	}
	// The range is the run's (taken now if it holds none): the warm
	// sandbox is made for this run alone, and its resume claims it.
	es, err := f.h.sandboxSpec(run, ch.Dir())
	var out executor.Output
	if err == nil {
		out, err = f.h.Output(run.ID)
	}
	var sb Created
	if err == nil {
		sb, err = cr.Create(ctx, SandboxID(run.ID, ch.Interval()), es, out)
	}
	if err != nil {
		ch.Close()
		return nil, err
	}
	return &Warm{run: run, spec: es, snap: *snap.Transcript, ch: ch, sb: sb}, nil
}

// errStale is a warm sandbox that is not the one Wake would make now.
var errStale = errors.New("the warm sandbox is not the one this wake would make")

// wakeWarm starts w's warm sandbox if it is the one start would make for
// run now: the same run, unit and grants, the transcript w resumes, the
// same spec over the same channel directory, and the interval the ledger
// says opens now (the channel reads the ledger again: results posted
// since it was made are delivered). Otherwise, or if its start fails, it
// is discarded and Wake makes a sandbox as it would without one.
func (f Transcript) wakeWarm(ctx context.Context, run Run, w Waking) (Woken, bool) {
	wm := w.Warm
	err := f.fits(run, w)
	if err == nil {
		err = wm.ch.Reload()
	}
	if err == nil && wm.sb.ID() != SandboxID(run.ID, wm.ch.Interval()) {
		err = fmt.Errorf("%w: the ledger opens interval %d", errStale, wm.ch.Interval())
	}
	if err == nil {
		m := f.h.Mark(run.ID)
		if err = wm.sb.Begin(ctx); err == nil {
			return Woken{Unit: &Unit{Run: run, Sandbox: wm.sb, ch: wm.ch}, Event: "resumed", Mark: m, Warm: true}, true
		}
	}
	if f.h.Log != nil {
		f.h.Log.Warn("warm sandbox not used; making one", "run", run.ID, "sandbox", wm.sb.ID(), "err", err)
	}
	if derr := wm.Discard(context.WithoutCancel(ctx)); derr != nil && f.h.Log != nil {
		f.h.Log.Error("warm sandbox not removed; the next reconcile removes it", "run", run.ID, "sandbox", wm.sb.ID(), "err", derr)
	}
	return Woken{}, false
}

// fits checks that w's warm sandbox is the one start would make for run.
func (f Transcript) fits(run Run, w Waking) error {
	wm := w.Warm
	dir := calls.ChannelDir(f.h.StateDir, run.ID)
	switch {
	case !reflect.DeepEqual(run, wm.run):
		return fmt.Errorf("%w: it was made for another run, unit or grant set", errStale)
	case w.Snapshot.Transcript == nil || *w.Snapshot.Transcript != wm.snap:
		return fmt.Errorf("%w: it holds transcript %s", errStale, wm.snap)
	}
	es, err := f.h.sandboxSpec(run, dir)
	if err != nil {
		return err
	}
	if wm.ch.Dir() != dir || !reflect.DeepEqual(es, wm.spec) {
		return fmt.Errorf("%w: its spec differs", errStale)
	}
	return nil
}
