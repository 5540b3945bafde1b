package forms

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Transcript is the transcript form: a unit parked as the transcript it
// keeps through its channel (internal/calls), woken in a new sandbox over
// it. Each interval has its own channel and sandbox (SandboxID), so the
// next interval's sandbox starts while the last one is torn down.
type Transcript struct{ h Env }

// Ready admits every transcript unit: it needs no CRIU.
func (f Transcript) Ready(context.Context, string) error { return nil }

// Start starts run's first sandbox, with its channel.
func (f Transcript) Start(ctx context.Context, run Run) (Woken, error) {
	return f.start(ctx, run, nil)
}

// Wake starts a new sandbox over the run's sealed transcript.
func (f Transcript) Wake(ctx context.Context, run Run, w Waking) (Woken, error) {
	if !w.Snapshot.IsTranscript() {
		return Woken{}, fmt.Errorf("resume %s: %w", run.ID, ErrFormMismatch)
	}
	if w.Warm != nil {
		if woken, ok := f.wakeWarm(ctx, run, w); ok {
			return woken, nil
		}
	}
	return f.start(ctx, run, w.Snapshot.Transcript)
}

// start opens the run's channel for its next interval (with restored, the
// transcript of a resume, in it) and starts a sandbox with the channel
// mounted.
func (f Transcript) start(ctx context.Context, run Run, restored *record.Address) (Woken, error) {
	id := run.ID
	ch, err := f.open(id, restored, run.Grants.Limits)
	if err != nil {
		return Woken{}, err
	}
	es, err := f.h.sandboxSpec(run, ch.Dir())
	var out executor.Output
	if err == nil {
		out, err = f.h.Output(id)
	}
	m := f.h.Mark(id)
	var sb Sandbox
	if err == nil {
		sb, err = f.h.Sandboxes.Start(ctx, SandboxID(id, ch.Interval()), es, out)
	}
	if err != nil {
		ch.Close()
		return Woken{}, err
	}
	event := "started"
	if restored != nil {
		event = "resumed"
	}
	return Woken{Unit: &Unit{Run: run, Sandbox: sb, ch: ch}, Event: event, Mark: m}, nil
}

// sandboxSpec is the spec of a sandbox of run with its channel directory
// dir mounted: Wake's and a warm sandbox's (Prepare) alike, in the user
// namespace of the run's range where units run in user namespaces (a
// transcript unit needs no probe: it is never checkpointed).
func (h Env) sandboxSpec(run Run, dir string) (executor.Spec, error) {
	es, err := h.unitSpec(run, true, false)
	if err != nil {
		return es, err
	}
	// Read-only: the unit reads its transcript and connects to the
	// socket (connecting writes nothing to the file system); it cannot
	// replace, add or remove anything the daemon reads. Own: the daemon's
	// own directory, under its state dir, noexec.
	es.Mounts = append(es.Mounts, executor.Mount{Source: dir, Target: protocol.Dir, Own: true})
	return es, nil
}

// open makes run id's channel directory (STATE/ch/RUN) and spool
// (STATE/spool/RUN), with the transcript restored from its sealed object
// when the run resumes.
func (f Transcript) open(id string, restored *record.Address, lim unit.Limits) (*calls.Channel, error) {
	cfg := calls.Config{Run: id, Dir: calls.ChannelDir(f.h.StateDir, id),
		Spool: filepath.Join(f.h.StateDir, "spool", id), Limits: lim, Restore: restored}
	ch, err := calls.Open(cfg, f.h.Store, f.h.Calls)
	if errors.Is(err, calls.ErrPath) && f.h.Invalid != nil {
		err = fmt.Errorf("%w: %w", f.h.Invalid, err)
	}
	if err != nil {
		return nil, err
	}
	return ch, nil
}

// ErrNoChannel is a park of a transcript unit without a channel: one the
// last daemon process served, reattached after it exited.
var ErrNoChannel = errors.New("the unit's channel was the last daemon's: it cannot be sealed")

// Keys are the manifest keys a transcript park records.
func (Transcript) Keys() []string { return manifest.TranscriptKeys }

// Snapshot freezes the unit and seals its transcript. The caller holds
// the channel's gate (Unit.Hold). Refused, the unit is thawed.
func (f Transcript) Snapshot(ctx context.Context, u *Unit) (Taken, error) {
	if u.ch == nil {
		return Taken{}, fmt.Errorf("park %s: %w", u.ID, ErrNoChannel)
	}
	if err := u.Sandbox.Pause(ctx); err != nil {
		return Taken{}, fmt.Errorf("park %s: %w", u.ID, err)
	}
	snap, retained, err := u.ch.Seal(ctx)
	if err != nil {
		if rerr := u.Sandbox.Resume(context.Background()); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return Taken{}, err
	}
	return Taken{Snapshot: snap, Retained: retained, Keys: f.Keys()}, nil
}

// Thaw thaws the unit the snapshot froze.
func (f Transcript) Thaw(_ context.Context, u *Unit) error {
	return u.Sandbox.Resume(context.Background())
}

// Reattached reports a unit found not stopped for recovery: its channel
// went with the daemon that served it. (A unit that exited meanwhile is
// closed by its watcher, unaccounted too.)
func (f Transcript) Reattached(_ context.Context, _ *Unit, status string) (bool, error) {
	return status != "stopped", nil
}

// Recover freezes the unit (one gone, Gone, is stopped already) and
// stores the transcript it left on disk (calls.Recover): the park is
// recorded without an account (the account was the dead daemon's; the
// ledger drops the calls of that interval with it), so the record stays
// honest — its wait proof becomes Unproved — and the run resumes from its
// transcript. Its Cleanup removes the channel directory.
//
// The transcript on disk is taken only where it extends sealed's, the
// one the interval began from: its writes are not synced, so a power loss
// can leave it short or missing (past sealed's bytes, a torn tail is not
// told). One short, missing or refused as a transcript sends the run back
// to sealed (none: the recovery is refused).
func (f Transcript) Recover(ctx context.Context, u *Unit, sealed *record.Snapshot) (Taken, error) {
	if status, _ := u.Sandbox.Status(ctx); status != "paused" && status != "stopped" {
		if err := u.Sandbox.Pause(ctx); err != nil {
			return Taken{}, err
		}
	}
	dir := calls.ChannelDir(f.h.StateDir, u.ID)
	taken := func(a record.Address, reason string) Taken {
		return Taken{Snapshot: record.TranscriptSnapshot(a), Keys: manifest.TranscriptKeys,
			Details: []attest.Detail{attest.Recovered{Reason: reason}},
			Cleanup: func() error { return os.RemoveAll(dir) }}
	}
	a, err := calls.Recover(ctx, f.h.Store, f.h.StateDir, u.ID, u.Grants.Limits.Or(unit.DefaultLimits).TranscriptBytes)
	if err == nil && sealed != nil && sealed.IsTranscript() {
		if err = f.extends(a, *sealed.Transcript); err != nil && !errors.Is(err, errShort) {
			// The sealed transcript unreadable, the one on disk is
			// taken unchecked, as before the check.
			f.h.Log.Warn("reconcile: the transcript the interval began from could not be read; taking the one on disk", "run", u.ID, "err", err)
			err = nil
		}
	}
	switch {
	case err == nil:
		return taken(a, "the daemon serving the unit's channel stopped; the interval's call account was lost with it"), nil
	case sealed != nil && sealed.IsTranscript() && (errors.Is(err, errShort) || errors.Is(err, os.ErrNotExist) || errors.Is(err, calls.ErrTranscript)):
		f.h.Log.Warn("reconcile: the run goes back to the transcript its interval began from", "run", u.ID, "err", err)
		return taken(*sealed.Transcript, "the daemon serving the unit's channel stopped, and the transcript it left does not extend the one the interval began from; the run goes back to that one"), nil
	}
	return Taken{}, err
}

// errShort is a transcript on disk that does not extend the one its
// interval began from.
var errShort = errors.New("the transcript on disk does not extend the one its interval began from")

// extends reports, as nil, whether transcript a begins with sealed's bytes.
func (f Transcript) extends(a, sealed record.Address) error {
	if a == sealed {
		return nil
	}
	got, err := f.h.Store.Open(a)
	if err != nil {
		return err
	}
	defer got.Close()
	want, err := f.h.Store.Open(sealed)
	if err != nil {
		return err
	}
	defer want.Close()
	var b1, b2 [32 << 10]byte
	for {
		n, err := io.ReadFull(want, b1[:])
		if n > 0 {
			if m, _ := io.ReadFull(got, b2[:n]); m != n || !bytes.Equal(b1[:n], b2[:n]) {
				return errShort
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Awaited is what run r awaits of the platform's results, and whether a
// post wakes it now: a run parked in its transcript wakes once every
// result its await named is posted; any other awaits nothing.
func (h Env) Awaited(r store.Run) (waiting []string, wake bool, err error) {
	if r.Phase != record.PhaseParked || !r.Parked.IsTranscript() {
		return nil, false, nil
	}
	waiting, err = calls.Awaiting(h.Store, r.ID)
	return waiting, err == nil && len(waiting) == 0, err
}
