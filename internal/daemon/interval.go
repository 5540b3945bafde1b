package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// live is a run's sandbox on this host and its open interval
// (internal/interval, the one place intervals end).
type live struct {
	sb     Sandbox
	spec   unit.Spec
	grants unit.Grants
	iv     *interval.Interval
	// stopping is set, under the run's lock, before the daemon destroys
	// the sandbox on purpose, so that the exit watcher leaves it alone.
	stopping bool
	// transcript is the transcript-mode channel, nil for image mode.
	transcript *calls.Channel
}

// intervals is this host's side of every interval (internal/interval),
// made from the daemon's state directory, store, signer and meter at each
// use.
func (d *Daemon) intervals() interval.Host {
	return interval.Host{StateDir: d.cfg.StateDir, Store: d.records(), Signer: d.signer, Meter: interval.IdleMeter{M: d.meter}, Log: d.log}
}

// markNow is a mark at this instant for run id's output.
func (d *Daemon) markNow(id string) interval.Mark { return d.intervals().MarkNow(id) }

// begin starts an interval on sb from m.
func (d *Daemon) begin(id string, sb Sandbox, spec unit.Spec, grants unit.Grants, event string, m interval.Mark) *live {
	return &live{sb: sb, spec: spec, grants: grants, iv: d.intervals().Begin(id, sb, grants.Limits, event, m)}
}

// reattach goes on with the interval an earlier daemon process began on
// sb, from the mark it saved (or from now, without one).
func (d *Daemon) reattach(id string, sb Sandbox, spec unit.Spec, grants unit.Grants) *live {
	return &live{sb: sb, spec: spec, grants: grants, iv: d.intervals().Reattach(id, sb, grants.Limits)}
}

func (d *Daemon) markPath(id string) string { return d.intervals().MarkPath(id) }

// saveMark keeps lv's start for a restarted daemon.
func (d *Daemon) saveMark(_ string, lv *live) { d.intervals().SaveMark(lv.iv) }

func (d *Daemon) dropMark(id string) { d.intervals().DropMark(id) }

// end ends lv's interval and records it: the Executed segment with calls,
// then the segments in then, in one transaction (internal/interval). On
// success the receipt is counted.
func (d *Daemon) end(ctx context.Context, lv *live, outcome attest.Outcome, calls *record.CallAccount, then []record.Segment, extra ...attest.Entry) (interval.Sealed, error) {
	return d.endAt(ctx, lv, "", outcome, calls, then, extra...)
}

// endAt is end with a failpoint armed between the sealing and the append.
func (d *Daemon) endAt(ctx context.Context, lv *live, step string, outcome attest.Outcome, calls *record.CallAccount, then []record.Segment, extra ...attest.Entry) (interval.Sealed, error) {
	if lv.transcript != nil {
		lv.iv.Channel(lv.transcript.Spooled)
	}
	var sealed func()
	if step != "" {
		sealed = func() { d.reach(step) }
	}
	s, err := d.intervals().End(ctx, lv.iv, sealed, outcome, calls, then, extra...)
	if err != nil {
		return interval.Sealed{}, d.fleetErr(err)
	}
	d.metrics.Receipt(s.Receipt)
	return s, nil
}
