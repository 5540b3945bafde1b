package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/metrics"
)

// live is a run's sandbox on this host and its open interval
// (internal/interval, the one place intervals end).
type live struct {
	sb   Sandbox
	unit *forms.Unit // sb in the run's form (internal/forms)
	iv   *interval.Interval
	// stopping is set, under the run's lock, before the daemon destroys
	// the sandbox on purpose, so that the exit watcher leaves it alone.
	stopping bool
}

// destroy removes a sandbox the daemon is done with, logging to log one
// that is not. The caller holds the run's lock (or owns lv alone).
//
// The caller sets lv.stopping first, under the run's lock, when the exit
// watcher may see lv.
func (lv *live) destroy(log *slog.Logger) {
	lv.unit.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := lv.sb.Destroy(ctx); err != nil {
		log.Error("sandbox not destroyed; the next reconcile retries", "sandbox", lv.sb.ID(), "err", err)
	}
}

// intervals is this host's side of every interval: internal/interval's
// recorder over the daemon's state directory, signer and meter, ending
// each interval in the store through the fleet's fence as it is at that
// end, counting each receipt. Wired once (wire).
type intervals struct {
	interval.Recorder
	fleet   *member.Member
	metrics *metrics.Metrics
	reach   func(step string) // the daemon's hook at each step (Daemon.reach)
}

// begin starts an interval on u from m.
func (r intervals) begin(id string, u *forms.Unit, event string, m interval.Mark) *live {
	return &live{sb: u.Sandbox, unit: u, iv: r.Begin(id, u.Sandbox, u.Grants.Limits, event, m)}
}

// reattach goes on with the interval an earlier daemon process began on
// u, from the mark it saved (or from now, without one).
func (r intervals) reattach(id string, u *forms.Unit) *live {
	return &live{sb: u.Sandbox, unit: u, iv: r.Reattach(id, u.Sandbox, u.Grants.Limits)}
}

// restart starts a new interval on lv's sandbox, metered and journaled
// from now, after the end of the last one could not be recorded. Only
// the interval is replaced: the exit watcher reads lv's sandbox.
func (r intervals) restart(id string, lv *live, event string) {
	m := r.MarkNow(id)
	m.Discarded[0], m.Discarded[1] = lv.sb.Omitted()
	lv.iv = r.begin(id, lv.unit, event, m).iv
	r.SaveMark(lv.iv)
}

// end ends lv's interval with e and records it: the Executed segment
// with e.Calls, then e.Then, in one transaction (internal/interval), with
// a failpoint armed at step (when not empty) between the sealing and the
// append. On success the receipt is counted.
func (r intervals) end(ctx context.Context, lv *live, step string, e interval.Ending) (interval.Sealed, error) {
	lv.unit.Spool(lv.iv)
	var sealed func()
	if step != "" {
		sealed = func() { r.reach(step) }
	}
	rec := r.Recorder
	rec.Store = r.fleet.Records() // a rejoin replaces the fence
	s, err := rec.End(ctx, lv.iv, sealed, e)
	if err != nil {
		return interval.Sealed{}, r.fleet.Err(err)
	}
	r.metrics.Receipt(s.Receipt)
	if s.Traffic != nil {
		r.metrics.Traffic(s.Traffic.InBytes, s.Traffic.OutBytes)
	}
	return s, nil
}
