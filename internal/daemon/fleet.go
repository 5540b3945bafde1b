package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A host in a fleet (Config.Fleet) appends to a run only while it owns it:
// each advance is reserved in etcd before bbolt makes it (fleet.Fence;
// docs/fleet.md, "The order of the two writes"). Alone, nothing here
// reserves anything and the store is appended to directly.

// session is this host's current session in the fleet: Config.Fleet's, or
// the one that replaced it after its lease was lost; nil alone.
func (d *Daemon) session() *fleet.Host {
	if h := d.rejoined.Load(); h != nil {
		return h
	}
	return d.cfg.Fleet
}

// watchLease replaces a session whose lease is lost (Config.Rejoin), in the
// background: until then the host appends and resumes nothing (the fence
// refuses); once rejoined it reconciles with the directory as at a start,
// claiming back the runs no other host took meanwhile.
func (d *Daemon) watchLease() {
	if d.cfg.Fleet == nil || d.cfg.Rejoin == nil {
		return
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		for {
			h := d.session()
			select {
			case <-d.bgCtx.Done():
				return
			case <-h.Done():
			}
			d.log.Error("fleet: this host's lease is lost; it appends nothing until it rejoins", "err", h.Err())
			nh := d.rejoin()
			if nh == nil {
				return
			}
			d.rejoined.Store(nh)
			elsewhere, err := d.reconcileFleet(d.bgCtx)
			if err != nil {
				d.log.Error("fleet: reconciling after the rejoin", "err", err)
			}
			d.dropElsewhere(elsewhere)
			d.log.Info("fleet: rejoined with a new session", "lease", nh.Lease())
		}
	}()
}

// dropElsewhere destroys, without an append, the sandboxes of runs that
// another host took while this one was cut off (their units frozen here).
func (d *Daemon) dropElsewhere(elsewhere map[string]bool) {
	for id := range elsewhere {
		d.mu.Lock()
		r := d.runs[id]
		d.mu.Unlock()
		if r == nil {
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

// rejoin tries Config.Rejoin every second until it succeeds, or the
// daemon stops (nil).
func (d *Daemon) rejoin() *fleet.Host {
	for {
		ctx, cancel := context.WithTimeout(d.bgCtx, 10*time.Second)
		h, err := d.cfg.Rejoin(ctx)
		cancel()
		if err == nil {
			return h
		}
		d.log.Warn("fleet: rejoin", "err", err)
		select {
		case <-d.bgCtx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// fleetErr counts err when it is the fleet's refusal of a transition
// (runrecordd_ownership_refusals_total), and returns it.
func (d *Daemon) fleetErr(err error) error {
	if errors.Is(err, fleet.ErrNotOwner) || errors.Is(err, fleet.ErrHeadMoved) || errors.Is(err, fleet.ErrLeaseLost) {
		d.metrics.OwnershipRefused()
	}
	return err
}

// records is the store the daemon appends through: the fleet's fence in a
// fleet, the store itself alone.
func (d *Daemon) records() interval.Store {
	if f := d.fence(); f != nil {
		return f
	}
	return d.st
}

// fence is the store as the fleet lets this host append to it, over the
// current session; nil alone.
func (d *Daemon) fence() *fleet.Fence {
	h := d.session()
	if h == nil {
		return nil
	}
	return &fleet.Fence{Store: d.st, Host: h}
}

// reservation is an advance of a run the fleet confirmed before the
// daemon makes it (a resume holds one while it restores the unit); alone,
// it reserves nothing and appends to the store.
type reservation struct {
	d    *Daemon
	id   string
	head record.Address
	segs []record.Segment
	r    *fleet.Reservation // nil alone
}

// reserve reserves segs at run id's head.
func (d *Daemon) reserve(ctx context.Context, id string, segs ...record.Segment) (*reservation, error) {
	head, err := d.st.Head(id)
	if err != nil {
		return nil, err
	}
	res := &reservation{d: d, id: id, head: head, segs: segs}
	if f := d.fence(); f != nil {
		if res.r, err = f.Reserve(ctx, id, head, segs...); err != nil {
			return nil, d.fleetErr(err)
		}
	}
	return res, nil
}

// append makes the reserved advance; refused, the fleet's reservation is
// taken back.
func (r *reservation) append(ctx context.Context) error {
	if r.r != nil {
		_, err := r.r.Append(ctx)
		return err
	}
	_, err := r.d.st.AppendAll(r.id, r.head, r.segs...)
	return err
}

// cancel takes the reservation back: the advance will not be made.
func (r *reservation) cancel(ctx context.Context) {
	if r.r == nil {
		return
	}
	if err := r.r.Cancel(ctx); err != nil {
		r.d.log.Error("fleet: a reservation not taken back; the host's next start takes it back", "run", r.id, "err", err)
	}
}

// claim makes a new run this host's in the fleet, at its genesis, before
// its sandbox starts; unclaim takes the claim back when the run is not
// created after all.
func (d *Daemon) claim(ctx context.Context, id string, genesis record.Address) error {
	if d.session() == nil {
		return nil
	}
	_, err := d.session().Claim(ctx, genesis, id, genesis, record.Active)
	return d.fleetErr(err)
}

func (d *Daemon) unclaim(ctx context.Context, id string, genesis record.Address) {
	if d.session() == nil {
		return
	}
	if err := d.session().Remove(context.WithoutCancel(ctx), genesis); err != nil {
		d.log.Error("fleet: the claim of a run never created is left; the next start removes it", "run", id, "err", err)
	}
}

// guardEvery is how often guardLease looks at the lease.
const guardEvery = 100 * time.Millisecond

// guardLease freezes this host's executing units when its lease is about
// to lapse unconfirmed — less than a third of its time to live left: two
// renewals missed — and thaws them once it is confirmed again, by a
// renewal or a new session (docs/fleet.md, "A host without its lease").
// etcd cannot expire the lease, and so no other host adopt a run, before
// ValidUntil: by then every unit here is frozen. A run busy with an
// operation is left to it: the fence refuses its append meanwhile.
func (d *Daemon) guardLease() {
	if d.cfg.Fleet == nil {
		return
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		frozen := map[string]*live{}
		t := time.NewTicker(guardEvery)
		defer t.Stop()
		for {
			select {
			case <-d.bgCtx.Done():
				return
			case <-t.C:
			}
			h := d.session()
			short := time.Until(h.ValidUntil()) < h.TTL()/3
			switch {
			case short && len(frozen) == 0:
				d.freezeAll(frozen)
			case !short && len(frozen) > 0:
				d.thawAll(frozen)
			}
		}
	}()
}

// freezeAll pauses every unit executing here that no operation holds,
// noting each in frozen.
func (d *Daemon) freezeAll(frozen map[string]*live) {
	d.mu.Lock()
	runs := make(map[string]*run, len(d.runs))
	for id, r := range d.runs {
		runs[id] = r
	}
	d.mu.Unlock()
	for id, r := range runs {
		if !r.mu.TryLock() {
			continue
		}
		if lv := r.live; lv != nil {
			if err := lv.sb.Pause(d.bgCtx); err == nil {
				frozen[id] = lv
			} else {
				d.log.Error("fleet: a unit not frozen as the lease lapses", "run", id, "err", err)
			}
		}
		r.mu.Unlock()
	}
	d.log.Warn("fleet: the lease is lapsing unconfirmed; this host's units are frozen", "frozen", len(frozen))
}

// thawAll resumes the units freezeAll froze that are still this host's
// (the same sandbox); one another host took meanwhile was destroyed by the
// reconcile of the rejoin.
func (d *Daemon) thawAll(frozen map[string]*live) {
	for id, lv := range frozen {
		d.mu.Lock()
		r := d.runs[id]
		d.mu.Unlock()
		r.mu.Lock()
		if r.live == lv {
			if err := lv.sb.Settle(d.bgCtx); err != nil {
				d.log.Error("fleet: a frozen unit not thawed", "run", id, "err", err)
			}
		}
		r.mu.Unlock()
		delete(frozen, id)
	}
	d.log.Info("fleet: the lease is confirmed again; this host's units are thawed")
}
