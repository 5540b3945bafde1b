package daemon

import (
	"context"
	"errors"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A host in a fleet (Config.Fleet) appends to a run only while it owns it:
// each advance is reserved in etcd before bbolt makes it (fleet.Fence;
// docs/fleet.md, "The order of the two writes"). Alone, nothing here
// reserves anything and the store is appended to directly.

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
	if d.cfg.Fleet == nil {
		return d.st
	}
	return &fleet.Fence{Store: d.st, Host: d.cfg.Fleet}
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
	if d.cfg.Fleet != nil {
		f := &fleet.Fence{Store: d.st, Host: d.cfg.Fleet}
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
	if d.cfg.Fleet == nil {
		return nil
	}
	_, err := d.cfg.Fleet.Claim(ctx, genesis, id, genesis, record.Active)
	return d.fleetErr(err)
}

func (d *Daemon) unclaim(ctx context.Context, id string, genesis record.Address) {
	if d.cfg.Fleet == nil {
		return
	}
	if err := d.cfg.Fleet.Remove(context.WithoutCancel(ctx), genesis); err != nil {
		d.log.Error("fleet: the claim of a run never created is left; the next start removes it", "run", id, "err", err)
	}
}
