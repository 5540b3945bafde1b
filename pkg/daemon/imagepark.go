package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/executor"
)

// ErrImageParks is an image-mode run, park or resume on a host where image
// parks are unavailable: the probe at start could not dump and restore
// (the message says why). Transcript runs are unaffected.
var ErrImageParks = errors.New("image parks are unavailable on this host")

// Deadlines of CRIU's dumps and restores (docs/daemon.md): a base, plus a
// second for every 64 MiB of memory the operation moves.
const (
	criuBaseDeadline = 30 * time.Second
	criuDeadlineRate = 64 << 20 // bytes per second of deadline
)

// criuDeadline is the deadline of a dump or restore that moves memBytes of
// memory: Config.CRIUDeadline when set, derived from memBytes otherwise.
func (d *Daemon) criuDeadline(memBytes uint64) time.Duration {
	if d.cfg.CRIUDeadline > 0 {
		return d.cfg.CRIUDeadline
	}
	return criuBaseDeadline + time.Duration(memBytes/criuDeadlineRate)*time.Second
}

// probeDeadline bounds each step of the probe: its units are small.
func (d *Daemon) probeDeadline() time.Duration { return d.criuDeadline(0) }

// imageParks is the outcome of the probe the daemon runs at start.
type imageParks struct {
	done chan struct{} // closed once probe is set
	p    executor.Probe
}

// startProbe probes, in the background, whether this host can checkpoint
// and restore (a throwaway process and a throwaway container, each step
// under the deadline): `criu check` passing is not enough.
// A CRIU that did not tell its version (criuErr) is not probed.
func (d *Daemon) startProbe(criuErr error) {
	d.probe = &imageParks{done: make(chan struct{})}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		defer close(d.probe.done)
		var p executor.Probe
		if criuErr != nil {
			p.Reason = criuErr.Error()
		} else {
			p = d.ex.Probe(d.bgCtx, d.probeDeadline())
		}
		d.probe.p = p
		if p.OK {
			d.log.Info("image parks available", "probe", p.Took, "notes", strings.Join(p.Notes, "; "))
		} else {
			d.log.Error("image parks unavailable on this host; transcript runs still work", "reason", p.Reason, "probe", p.Took)
		}
	}()
}

// imageParksReady waits for the probe and returns nil when image parks
// work here, an error wrapping ErrImageParks otherwise.
func (d *Daemon) imageParksReady(ctx context.Context) error {
	select {
	case <-d.probe.done:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the image-park probe: %w", ctx.Err())
	}
	if !d.probe.p.OK {
		return fmt.Errorf("%w: %s", ErrImageParks, d.probe.p.Reason)
	}
	return nil
}

// imageParksStatus is the probe's outcome for `runrecordd host`.
func (d *Daemon) imageParksStatus() api.ImageParks {
	select {
	case <-d.probe.done:
	default:
		return api.ImageParks{Status: "probing"}
	}
	p := d.probe.p
	out := api.ImageParks{Status: "available", Notes: p.Notes, ProbeNS: int64(p.Took)}
	if !p.OK {
		out.Status, out.Reason = "unavailable", p.Reason
	}
	return out
}
