package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/member"
)

// The daemon's part in a fleet is the member room (internal/member): the
// session, the fence every append goes through, reconciling with the
// directory, migrations, adoption and a drain's placement. The daemon
// gives it its runs as its operations hold them (heldRun) and its units
// (units).

// joinFleet makes the daemon's member room from its configuration.
func (d *Daemon) joinFleet() {
	d.fleet = member.New(member.Config{
		Join:  d.cfg.Join,
		Store: d.st, Log: d.log, Metrics: &d.metrics, Publish: d.publish, Reach: d.reach,
		Import:     bundle.ImportOptions{Options: d.bundleOptions(), CheckID: checkID},
		Exportable: d.Exportable, Runs: runTable{d}, Fits: d.placement().Fits,
	})
}

// bundleOptions are how this host judges a bundle, or a run received
// from a peer: its limits, its trusted signers, its mount policy.
func (d *Daemon) bundleOptions() bundle.Options {
	return bundle.Options{Limits: d.cfg.BundleLimits, Trusted: d.Trusted, Policy: bundle.HostPolicy(d.cfg.BundleMounts, d.cfg.StateDir)}
}

// session is this host's current session in the fleet; nil alone.
func (d *Daemon) session() *fleet.Host { return d.fleet.Session() }

// fleetErr counts err when it is the fleet's refusal of a transition.
func (d *Daemon) fleetErr(err error) error { return d.fleet.Err(err) }

// records is the store the daemon appends through: the fleet's fence in a
// fleet, the store itself alone.
func (d *Daemon) records() interval.Store { return d.fleet.Records() }

// Fleet is the daemon's part in a fleet: its migrations, adoptions and
// drains (internal/member), over the daemon's run table (runTable).
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

func (h heldRun) Need(ctx context.Context) (drain.Need, error) { return h.d.needOf(ctx, h.id, h.r) }

func (h heldRun) Park(ctx context.Context) error {
	_, err := h.d.park(ctx, h.id, h.r)
	return err
}

func (h heldRun) Resume(ctx context.Context) error {
	_, err := h.d.resume(ctx, h.id, h.r)
	return err
}

// units is the daemon's executing units as the lease guard and a rejoin
// handle them (member.Units).
type units struct{ d *Daemon }

// Freeze pauses every unit executing here that no operation holds.
func (u units) Freeze(ctx context.Context) func(context.Context) {
	d := u.d
	frozen := map[*run]*live{}
	for id, r := range d.table() {
		if !r.mu.TryLock() {
			continue
		}
		if lv := r.live; lv != nil {
			if err := lv.sb.Pause(ctx); err == nil {
				frozen[r] = lv
			} else {
				d.log.Error("fleet: a unit not frozen as the lease lapses", "run", id, "err", err)
			}
		}
		r.mu.Unlock()
	}
	d.log.Warn("fleet: the lease is lapsing unconfirmed; this host's units are frozen", "frozen", len(frozen))
	if len(frozen) == 0 {
		return nil
	}
	// Thawed are those still this host's, the same sandbox: one another
	// host took meanwhile was destroyed by the reconcile of the rejoin.
	return func(ctx context.Context) {
		for r, lv := range frozen {
			r.mu.Lock()
			if r.live == lv {
				if err := lv.sb.Settle(ctx); err != nil {
					d.log.Error("fleet: a frozen unit not thawed", "sandbox", lv.sb.ID(), "err", err)
				}
			}
			r.mu.Unlock()
		}
		d.log.Info("fleet: the lease is confirmed again; this host's units are thawed")
	}
}

// Drop destroys, without an append, the sandboxes of runs another host
// took while this one was cut off (their units frozen here).
func (u units) Drop(ids map[string]bool) {
	d := u.d
	for id, r := range d.table() {
		if !ids[id] {
			continue
		}
		r.mu.Lock()
		if lv := r.live; lv != nil {
			lv.stopping = true
			d.destroy(lv)
			r.live = nil
			d.log.Warn("fleet: another host took the run while this one was cut off; its sandbox here is gone, nothing appended", "run", id)
		}
		r.mu.Unlock()
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
