package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

// reprobeAfter is how long after a failed probe a request that needs image
// parks probes again: a host whose CRIU is fixed gets them back without a
// restart, and a broken one is not probed on every request.
const reprobeAfter = time.Minute

// imageParks is the outcome of the latest probe.
type imageParks struct {
	mu       sync.Mutex
	done     chan struct{} // closed once p is set
	p        executor.Probe
	finished time.Time
	criuErr  error // CRIU did not tell its version at start: not probed
}

// startProbe probes, in the background, whether this host can checkpoint
// and restore (a throwaway process and a throwaway container, each step
// under the deadline): `criu check` passing is not enough. A CRIU that did
// not tell its version (criuErr) is not probed.
func (d *Daemon) startProbe(criuErr error) {
	d.probe = &imageParks{criuErr: criuErr}
	d.probe.mu.Lock()
	d.reprobeLocked()
	d.probe.mu.Unlock()
}

// reprobeLocked starts a probe; the caller holds d.probe.mu.
func (d *Daemon) reprobeLocked() {
	done := make(chan struct{})
	d.probe.done = done
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		var p executor.Probe
		if d.probe.criuErr != nil {
			p.Reason = d.probe.criuErr.Error()
		} else {
			p = d.ex.Probe(d.bgCtx, d.probeDeadline())
		}
		if p.OK {
			d.log.Info("image parks available", "probe", p.Took, "notes", strings.Join(p.Notes, "; "))
		} else if d.bgCtx.Err() != nil {
			d.log.Info("image park probe stopped: the daemon is shutting down", "probe", p.Took)
		} else {
			d.log.Error("image parks unavailable on this host; transcript runs still work", "reason", p.Reason, "probe", p.Took)
		}
		d.probe.mu.Lock()
		d.probe.p, d.probe.finished = p, time.Now()
		d.probe.mu.Unlock()
		close(done)
	}()
}

// imageParksReady waits for the probe and returns nil when image parks
// work here, an error wrapping ErrImageParks otherwise. A probe that
// failed over reprobeAfter ago is run again first.
func (d *Daemon) imageParksReady(ctx context.Context) error {
	d.probe.mu.Lock()
	select {
	case <-d.probe.done:
		if !d.probe.p.OK && d.probe.criuErr == nil && time.Since(d.probe.finished) > reprobeAfter && d.bgCtx.Err() == nil {
			d.reprobeLocked()
		}
	default:
	}
	done := d.probe.done
	d.probe.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the image-park probe: %w", ctx.Err())
	}
	d.probe.mu.Lock()
	p := d.probe.p
	d.probe.mu.Unlock()
	if !p.OK {
		return fmt.Errorf("%w: %s", ErrImageParks, p.Reason)
	}
	return nil
}

// imageParksStatus is the probe's outcome for `runrecordd host`.
func (d *Daemon) imageParksStatus() api.ImageParks {
	d.probe.mu.Lock()
	defer d.probe.mu.Unlock()
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
