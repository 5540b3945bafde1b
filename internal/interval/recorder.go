package interval

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Recorder is this host's side of every interval: where a run keeps its
// output and saved mark (StateDir/runs/<id>/), what meters it, and the
// store and signer an interval ends into. It holds no state of its own: a
// value is cheap to make.
type Recorder struct {
	StateDir string
	Store    Store
	Signer   *Signer
	Meter    Meter
	// Traffic reads runs' egress counters; nil on a host without egress.
	Traffic Traffic
	Log     *slog.Logger // slog.Default() when nil
}

// Output is run's output files on this host: runs/<id>/stdout and stderr.
func (h Recorder) Output(run string) Output {
	dir := filepath.Join(h.StateDir, "runs", run)
	return Output{Stdout: filepath.Join(dir, "stdout"), Stderr: filepath.Join(dir, "stderr")}
}

// MakeOutput is Output, its directory made.
func (h Recorder) MakeOutput(run string) (Output, error) {
	out := h.Output(run)
	if err := os.MkdirAll(filepath.Dir(out.Stdout), 0o700); err != nil {
		return out, fmt.Errorf("output directory: %w", err)
	}
	return out, nil
}

// MarkPath is where run's open interval keeps its mark: runs/<id>/interval.json.
func (h Recorder) MarkPath(run string) string {
	return filepath.Join(h.StateDir, "runs", run, "interval.json")
}

// config is where run keeps its interval's files; limits are the unit's
// granted limits (an unset one takes its default).
func (h Recorder) config(run string, limits unit.Limits) Config {
	return Config{Run: run, Output: h.Output(run), MarkPath: h.MarkPath(run), LogLimit: limits.Or(unit.DefaultLimits).LogBytes}
}

// MarkNow is a mark at this instant for run's output and egress
// counters. Counters not read are a warning: the interval's traffic then
// counts from the run's rules' installation on this host.
func (h Recorder) MarkNow(run string) Mark {
	m := MarkAt(time.Now().UnixNano(), h.Output(run))
	if h.Traffic != nil {
		c, held, err := h.Traffic.Counters(run)
		if err != nil {
			h.log().Warn("egress counters not read at an interval's start", "run", run, "err", err)
		}
		if held && err == nil {
			m.Traffic = &c
		}
	}
	return m
}

// Begin opens run's interval on sb from m and journals event. An interval
// the meter cannot meter is opened all the same (its receipt will be
// estimated, and say why), with a warning.
func (h Recorder) Begin(run string, sb Sandbox, limits unit.Limits, event string, m Mark) *Interval {
	iv := Begin(h.config(run, limits), sb, h.Meter, m, event)
	if err := iv.MeterErr(); err != nil {
		h.log().Warn("interval not metered from its start", "run", run, "err", err)
	}
	return iv
}

// Reattach goes on with the interval an earlier daemon process began on
// run's sb, from the mark it saved (from now, without one).
func (h Recorder) Reattach(run string, sb Sandbox, limits unit.Limits) *Interval {
	return Reattach(h.config(run, limits), sb, h.Meter)
}

// SaveMark keeps iv's start for a restarted daemon. A mark not saved is a
// warning, not a failure: a daemon restarted mid-interval then attests the
// interval from its restart.
func (h Recorder) SaveMark(iv *Interval) {
	if err := iv.Save(); err != nil {
		h.log().Warn("interval start not saved; a restarted daemon attests it from the restart", "run", iv.run, "err", err)
	}
}

// DropMark removes run's saved mark.
func (h Recorder) DropMark(run string) { DropMark(h.MarkPath(run)) }

// End ends iv with e and records it into the host's store under its
// signer ([Interval.End]); sealed, when set, runs between the sealing and
// the append.
//
// A run holding an egress link here gets a traffic entry (docs/
// attestation.md) before e.Extra: its counters' growth since the
// interval's mark, read now. Counters not read leave the entry out, with
// an error logged.
func (h Recorder) End(ctx context.Context, iv *Interval, sealed func(), e Ending) (Sealed, error) {
	var tr *attest.Traffic
	if h.Traffic != nil {
		now, held, err := h.Traffic.Counters(iv.run)
		switch {
		case err != nil:
			h.log().Error("egress counters not read; the interval's journal has no traffic entry", "run", iv.run, "err", err)
		case held || iv.traffic != nil:
			t := trafficOf(iv.traffic, now)
			tr = &t
			e.Extra = append([]attest.Entry{t.Entry(time.Now().UnixNano())}, e.Extra...)
		}
	}
	s, err := iv.End(ctx, Env{Store: h.Store, Signer: h.Signer, Sealed: sealed}, e)
	if err == nil {
		s.Traffic = tr
	}
	return s, err
}

func (h Recorder) log() *slog.Logger {
	if h.Log == nil {
		return slog.Default()
	}
	return h.Log
}
