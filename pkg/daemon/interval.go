package daemon

import (
	"context"
	"path/filepath"
	"time"

	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/idle"
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
	transcript *channel
}

// meterRole adapts the idle meter to the interval room's Meter.
type meterRole struct{ m *idle.Meter }

func (r meterRole) CgroupOf(pid int) (string, error) { return r.m.CgroupOf(pid) }

func (r meterRole) Begin(cg string) (interval.Metering, error) {
	iv, err := r.m.Begin(cg)
	if err != nil {
		return nil, err
	}
	return iv, nil
}

func (r meterRole) Reattach(cg string, start time.Time, cpuNS uint64) (interval.Metering, error) {
	iv, err := r.m.Reattach(cg, start, cpuNS)
	if err != nil {
		return nil, err
	}
	return iv, nil
}

// intervalConfig is where run id keeps its interval's files.
func (d *Daemon) intervalConfig(id string, grants unit.Grants) interval.Config {
	out := d.outputOf(id)
	return interval.Config{Run: id, Output: interval.Output{Stdout: out.Stdout, Stderr: out.Stderr},
		MarkPath: d.markPath(id), LogLimit: grants.Limits.Or(unit.DefaultLimits).LogBytes}
}

// markNow is a mark at this instant for run id's output.
func (d *Daemon) markNow(id string) interval.Mark {
	out := d.outputOf(id)
	return interval.MarkAt(nowNS(), interval.Output{Stdout: out.Stdout, Stderr: out.Stderr})
}

// begin starts an interval on sb from m.
func (d *Daemon) begin(id string, sb Sandbox, spec unit.Spec, grants unit.Grants, event string, m interval.Mark) *live {
	iv := interval.Begin(d.intervalConfig(id, grants), sb, meterRole{d.meter}, m, event)
	if err := iv.MeterErr(); err != nil {
		d.log.Warn("interval not metered from its start", "run", id, "err", err)
	}
	return &live{sb: sb, spec: spec, grants: grants, iv: iv}
}

// reattach goes on with the interval an earlier daemon process began on
// sb, from the mark it saved (or from now, without one).
func (d *Daemon) reattach(id string, sb Sandbox, spec unit.Spec, grants unit.Grants) *live {
	iv := interval.Reattach(d.intervalConfig(id, grants), sb, meterRole{d.meter})
	return &live{sb: sb, spec: spec, grants: grants, iv: iv}
}

func (d *Daemon) markPath(id string) string {
	return filepath.Join(d.cfg.StateDir, "runs", id, "interval.json")
}

// saveMark keeps lv's start for a restarted daemon.
func (d *Daemon) saveMark(id string, lv *live) {
	if err := lv.iv.Save(); err != nil {
		d.log.Warn("interval start not saved; a restarted daemon attests it from the restart", "run", id, "err", err)
	}
}

func (d *Daemon) dropMark(id string) { interval.DropMark(d.markPath(id)) }

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
	env := interval.Env{Store: d.st, Signer: d.signer}
	if step != "" {
		env.Sealed = func() { d.reach(step) }
	}
	sealed, err := lv.iv.End(ctx, env, outcome, calls, then, extra...)
	if err != nil {
		return interval.Sealed{}, err
	}
	d.metrics.Receipt(sealed.Receipt)
	return sealed, nil
}

func energyOf(rc attest.Receipt) api.Energy {
	return api.Energy{UJ: rc.UJ, Provenance: rc.Provenance.String(), Method: rc.Method, Inputs: rc.Inputs}
}

// apiCheckpoint is the journaled statistics as the API shows them.
func apiCheckpoint(c attest.Checkpointed) *api.Checkpoint {
	return &api.Checkpoint{TotalNS: c.TotalNS, PauseNS: c.PauseNS, DumpNS: c.DumpNS, DiffNS: c.DiffNS,
		FreezingNS: c.FreezingNS, FrozenNS: c.FrozenNS, MemDumpNS: c.MemDumpNS, MemWriteNS: c.MemWriteNS,
		Pages: c.Pages, PagesScan: c.PagesScan, ImageBytes: c.ImageBytes, RootBytes: c.RootBytes, IngestNS: c.IngestNS}
}

// apiRestore is a restore's statistics as the API shows them.
func apiRestore(r attest.Restored) *api.Restore {
	return &api.Restore{TotalNS: r.TotalNS, MaterializeNS: r.MaterializeNS, RootfsNS: r.RootfsNS, TaskNS: r.TaskNS,
		ForkingNS: r.ForkingNS, RestoreNS: r.RestoreNS, Pages: r.Pages}
}
