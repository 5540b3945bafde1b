package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The daemon's glue to the calls room (internal/calls): a transcript
// run's channel for each interval, the platform's results and the calls
// listing, and the recovery of a transcript whose channel died with the
// last daemon. Call state lives in the store's call ledger.

// callHost is the daemon as a channel's calls.Daemon.
type callHost struct{ d *Daemon }

func (h callHost) Dispatched(run string, c protocol.Call) {
	h.d.events.Publish(events.Event{Kind: "call.dispatched", Run: run, Call: c.ID, CallKind: c.Kind})
}

func (h callHost) Awaiting(run string, ch *calls.Channel) {
	d := h.d
	d.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := d.parkAwaiting(ctx, run, ch); err != nil {
			// The unit waits on; the platform sees why, and parks or
			// closes it by hand.
			d.log.Error("park on await", "run", run, "err", err)
			d.events.Publish(events.Event{Kind: "run.park_failed", Run: run, Detail: err.Error()})
		}
	})
}

// parkAwaiting parks run id for the await its channel ch received, unless
// the run has moved on (closed, or another sandbox) in the meantime.
func (d *Daemon) parkAwaiting(ctx context.Context, id string, ch *calls.Channel) (bool, error) {
	r, err := d.runs.lockRun(id)
	if err != nil {
		return false, err
	}
	defer r.mu.Unlock()
	if r.live == nil || r.live.unit.Channel() != ch {
		return false, nil
	}
	if _, err := d.park(ctx, id, r); err != nil {
		return false, err
	}
	// A result posted between the await and the park found the run
	// executing and resumed nothing: resume now if every awaited result
	// is here.
	if waiting, err := calls.Awaiting(d.st, id); err != nil || len(waiting) > 0 {
		return true, err
	}
	if _, err := d.resume(ctx, id, r, nil); err != nil {
		if errors.Is(err, answers.ErrStopping) {
			// Its results are all here: the next start resumes it.
			if err := d.comebacks.AddHead(d.st, id); err != nil {
				d.log.Error("stop", "run", id, "err", err)
			}
			return true, nil
		}
		d.log.Error("resume after park: every awaited result was posted before the park", "run", id, "err", err)
	}
	return true, nil
}

// PostResult takes the platform's result for one of run's calls awaiting
// one, into the call ledger (internal/calls). It refuses a call the run
// never dispatched, one already resolved and one that already has a
// result, so nothing accepted here can make an account malformed. When
// the run is parked and this was the last result its await named, the run
// resumes here.
func (d *Daemon) PostResult(ctx context.Context, run, call string, payload []byte) (answers.Posted, error) {
	r, err := d.runs.lockRun(run)
	if err != nil {
		return answers.Posted{}, err
	}
	defer r.mu.Unlock()
	st, err := d.st.Run(run)
	if err != nil {
		return answers.Posted{}, err
	}
	// A run handed off takes no results here, nor, in a fleet, one another
	// host owns (a post appends nothing, so no fence refuses it); the
	// ledger refuses the rest (calls.Post): a closed run, a payload that is
	// not JSON, a call the run cannot take.
	if err := bundle.HeldHere(d.st, run); err != nil {
		return answers.Posted{}, err
	}
	if err := d.fleet.Elsewhere(run); err != nil {
		return answers.Posted{}, err
	}
	if err := calls.Post(d.st, run, call, payload); err != nil {
		return answers.Posted{}, err
	}
	d.events.Publish(events.Event{Kind: "call.result", Run: run, Call: call})
	out := answers.Posted{Run: run, Call: call}
	var wake bool
	if out.Awaiting, wake, err = d.forms.Awaited(st); err != nil || !wake {
		return out, err
	}
	res, err := d.resume(ctx, run, r, nil)
	if err != nil {
		// The result is kept; the run stays parked and a later resume
		// (or a retry of the post's resume) delivers it.
		out.ResumeErr = err
		return out, nil
	}
	out.Resumed = &res
	return out, nil
}

// recoverUnit parks a unit whose channel died with the daemon that
// served it, from what it left on disk (its form's Recover): the interval
// is recorded without an account (the account was the dead daemon's; the
// ledger drops the calls of that interval with it), so the record stays
// honest — its wait proof becomes Unproved — and the run resumes from its
// transcript.
func (d *Daemon) recoverUnit(ctx context.Context, id string, lv *live) error {
	st, err := d.st.Run(id)
	if err != nil {
		return err
	}
	raw, err := d.st.Raw(id)
	if err != nil {
		return err
	}
	// The snapshot the interval began from: a Resumed segment's, the
	// Suspended one before it.
	var sealed *record.Snapshot
	if n := len(raw.Segments); n >= 2 && raw.Segments[n-1].Kind == record.Resumed {
		sealed = &raw.Segments[n-2].Snapshot
	}
	t, err := d.forms.For(lv.unit.Spec.Mode).Recover(ctx, lv.unit, sealed)
	if err != nil {
		return err
	}
	// No account (nil): the channel that kept it died with the daemon.
	// The channel's spool is not read either: the unit has no channel.
	if _, _, err := d.recordTaken(ctx, lv, taking{Taken: t, unitID: st.Unit}); err != nil {
		return err
	}
	lv.stopping = true
	lv.destroy(d.log)
	return t.Cleanup()
}
