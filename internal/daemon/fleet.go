package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The daemon's part in a fleet is the member room (internal/fleet/member): the
// session, the fence every append goes through, reconciling with the
// directory, migrations, adoption, drains and the lease's guard. The
// daemon gives it its run table (runTable) and its runs as its operations
// hold them (heldRun).

// joinFleet makes the daemon's member room from its configuration.
func (d *Daemon) joinFleet() {
	d.fleet = member.New(member.Config{
		Join:  d.cfg.Join,
		Store: d.st, Log: d.log, Metrics: &d.metrics, Publish: d.events.Publish, Reach: d.reach,
		Import:     bundle.ImportOptions{Options: d.bundleOptions(), CheckID: forms.CheckID},
		Exportable: func(id string) error { return d.exporter.Exportable(id) }, Runs: runTable{d},
		Fits:    func(ctx context.Context, id string) error { return d.placement().Fits(ctx, id) },
		MinFree: d.cfg.MinFree,
	})
}

// bundleOptions are how this host judges a bundle, or a run received
// from a peer: its limits, its trusted signers (the keys as wired when
// asked: the member room takes these before wire), its mount policy.
func (d *Daemon) bundleOptions() bundle.Options {
	return bundle.Options{Limits: d.cfg.BundleLimits, Trusted: func(k record.Address) bool { return d.keys.Trusted(k) }, Policy: bundle.HostPolicy(d.cfg.BundleMounts, d.cfg.StateDir)}
}

// Fleet is the daemon's part in a fleet: its migrations, adoptions and
// drains (internal/fleet/member), over the daemon's run table (runTable).
func (d *Daemon) Fleet() *member.Member { return d.fleet }

// runTable is the daemon's run table as the member room holds its runs.
type runTable struct{ d *Daemon }

func (t runTable) Hold(id string, fresh bool) (member.Held, func(), error) {
	var r *run
	if fresh {
		r = t.d.lock(id)
	} else {
		var err error
		if r, err = t.d.lockRun(id); err != nil {
			return nil, nil, err
		}
	}
	return heldRun{t.d, id, r}, r.mu.Unlock, nil
}

// heldRun is a run as the member room holds it: its lock held.
type heldRun struct {
	d  *Daemon
	id string
	r  *run
}

func (h heldRun) Executing() bool { return h.r.live != nil }

func (h heldRun) Need(ctx context.Context) (drain.Need, error) {
	var mem drain.Memory
	if h.r.live != nil {
		sb := h.r.live.sb
		mem = func(ctx context.Context) (uint64, error) {
			u, err := sb.Stats(ctx)
			return u.MemoryBytes, err
		}
	}
	return h.d.placement().Need(ctx, h.id, mem)
}

func (h heldRun) Park(ctx context.Context) error {
	_, err := h.d.park(ctx, h.id, h.r)
	return err
}

func (h heldRun) Resume(ctx context.Context) error {
	_, err := h.d.resume(ctx, h.id, h.r, nil)
	return err
}

// Idle holds every run in the table that no operation holds, one after
// another.
func (t runTable) Idle(fn func(id string, h member.Held)) {
	for id, r := range t.d.table() {
		if r.mu.TryLock() {
			fn(id, heldRun{t.d, id, r})
			r.mu.Unlock()
		}
	}
}

func (h heldRun) Freeze(ctx context.Context) (func(context.Context), error) {
	lv := h.r.live
	if lv == nil {
		return nil, nil
	}
	if err := lv.sb.Pause(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) {
		h.r.mu.Lock()
		defer h.r.mu.Unlock()
		if h.r.live == lv {
			if err := lv.sb.Settle(ctx); err != nil {
				h.d.log.Error("fleet: a frozen unit not thawed", "sandbox", lv.sb.ID(), "err", err)
			}
		}
	}, nil
}

func (h heldRun) Drop() {
	if lv := h.r.live; lv != nil {
		lv.stopping = true
		h.d.destroy(lv)
		h.r.live = nil
		h.d.log.Warn("fleet: another host took the run while this one was cut off; its sandbox here is gone, nothing appended", "run", h.id)
	}
}

// table is a copy of the run table.
func (d *Daemon) table() map[string]*run {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]*run, len(d.runs))
	for id, r := range d.runs {
		out[id] = r
	}
	return out
}
