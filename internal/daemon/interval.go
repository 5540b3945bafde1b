package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/internal/warmpool"
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

// wireForms makes this host's side of every interval (internal/interval)
// from the daemon's state directory, signer and meter (the store it ends
// intervals in is the fleet's fence as it is at each end: endAt), and its side of both forms (internal/forms) over it:
// once, at New (wire). The image-park gate joins the forms when its probe
// starts (startProbe).
func (d *Daemon) wireForms() {
	d.secrets = secrets.New(d.cfg.StateDir)
	d.intervals = interval.Recorder{StateDir: d.cfg.StateDir, Signer: d.signer, Meter: interval.IdleMeter{M: d.meter}, Log: d.log}
	output := func(id string) (executor.Output, error) {
		out, err := d.intervals.MakeOutput(id)
		return executor.Output(out), err
	}
	var warm *warmpool.Pool // none without a host (the daemon's unit tests)
	if d.base != nil {
		warm = d.base.Warm
	}
	d.forms = forms.Env{Store: d.st, Sandboxes: d.ex, StateDir: d.cfg.StateDir, Facts: d.host, Gate: d.probe, CRIUDeadline: d.cfg.CRIUDeadline,
		MinFree: d.cfg.MinFree, Calls: callHost{d}, Output: output, Mark: d.intervals.MarkNow, Invalid: answers.ErrInvalid, Log: d.log, Lazy: forms.LazyOf(d.ex, d.cfg.LazyResume), LazyServed: d.cfg.LazyServed,
		Warm: warm, Creates: d.creates(), Ranges: d.ranges(), HostRootImages: d.cfg.HostRootImages, Secrets: d.secrets}
}

// begin starts an interval on u from m.
func (d *Daemon) begin(id string, u *forms.Unit, event string, m interval.Mark) *live {
	return &live{sb: u.Sandbox, unit: u, iv: d.intervals.Begin(id, u.Sandbox, u.Grants.Limits, event, m)}
}

// reattach goes on with the interval an earlier daemon process began on
// u, from the mark it saved (or from now, without one).
func (d *Daemon) reattach(id string, u *forms.Unit) *live {
	return &live{sb: u.Sandbox, unit: u, iv: d.intervals.Reattach(id, u.Sandbox, u.Grants.Limits)}
}

// ranges are the host's user-namespace ranges where units run in user
// namespaces (forms.Env.Ranges); nil otherwise.
func (d *Daemon) ranges() *idmap.Ranges {
	if d.base == nil || !d.base.Config.UserNS {
		return nil
	}
	return d.base.Ranges
}

// creates makes the warm pool's sandboxes (forms.Creates); nil without a
// host.
func (d *Daemon) creates() forms.Creator {
	if d.base == nil {
		return nil
	}
	return forms.Creates(d.base.Exec)
}

// background runs fn in the daemon's background.
func (d *Daemon) background(fn func()) {
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		fn()
	}()
}

// endAt ends lv's interval with e and records it: the Executed segment
// with e.Calls, then e.Then, in one transaction
// (internal/interval), with a failpoint armed at step (when not empty)
// between the sealing and the append. On success the receipt is counted.
func (d *Daemon) endAt(ctx context.Context, lv *live, step string, e interval.Ending) (interval.Sealed, error) {
	lv.unit.Spool(lv.iv)
	var sealed func()
	if step != "" {
		sealed = func() { d.reach(step) }
	}
	rec := d.intervals
	rec.Store = d.fleet.Records() // a rejoin replaces the fence
	s, err := rec.End(ctx, lv.iv, sealed, e)
	if err != nil {
		return interval.Sealed{}, d.fleet.Err(err)
	}
	d.metrics.Receipt(s.Receipt)
	return s, nil
}
