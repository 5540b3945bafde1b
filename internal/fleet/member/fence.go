package member

import (
	"context"
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A host in a fleet appends to a run only while it owns it: each advance
// is reserved in etcd before bbolt makes it (fleet.Fence; docs/fleet.md,
// "The order of the two writes"). Alone, nothing is reserved and the store
// is appended to directly.

// Records is the store the daemon appends through: the fleet's fence over
// the current session, the store itself alone.
func (m *Member) Records() interval.Store {
	if f := m.fence(); f != nil {
		return f
	}
	return m.cfg.Store
}

// Append appends segs to run id at its current head, in one transaction,
// through Records.
func (m *Member) Append(id string, segs ...record.Segment) error {
	head, err := m.cfg.Store.Head(id)
	if err != nil {
		return err
	}
	_, err = m.Records().AppendAll(id, head, segs...)
	return m.Err(err)
}

func (m *Member) fence() *fleet.Fence {
	h := m.Session()
	if h == nil {
		return nil
	}
	return &fleet.Fence{Store: m.cfg.Store, Session: h}
}

// Reservation is an advance of a run the fleet confirmed before the
// daemon makes it (a resume holds one while it restores the unit); alone,
// it reserves nothing and appends to the store.
type Reservation struct {
	m    *Member
	id   string
	head record.Address
	segs []record.Segment
	r    *fleet.Reservation // nil alone
}

// Reserve reserves segs at run id's head.
func (m *Member) Reserve(ctx context.Context, id string, segs ...record.Segment) (*Reservation, error) {
	head, err := m.cfg.Store.Head(id)
	if err != nil {
		return nil, err
	}
	res := &Reservation{m: m, id: id, head: head, segs: segs}
	if f := m.fence(); f != nil {
		if res.r, err = f.Reserve(ctx, id, head, segs...); err != nil {
			return nil, m.Err(err)
		}
	}
	return res, nil
}

// Append makes the reserved advance; refused, the fleet's reservation is
// taken back.
func (r *Reservation) Append(ctx context.Context) error {
	if r.r != nil {
		_, err := r.r.Append(ctx)
		return err
	}
	_, err := r.m.cfg.Store.AppendAll(r.id, r.head, r.segs...)
	return err
}

// Cancel takes the reservation back: the advance will not be made.
func (r *Reservation) Cancel(ctx context.Context) {
	if r.r == nil {
		return
	}
	if err := r.r.Cancel(ctx); err != nil {
		r.m.cfg.Log.Error("fleet: a reservation not taken back; the host's next start takes it back", "run", r.id, "err", err)
	}
}

// Claim makes a new run this host's in the fleet, at its genesis, before
// its sandbox starts; Unclaim takes the claim back when the run is not
// created after all.
func (m *Member) Claim(ctx context.Context, id string, genesis record.Address) error {
	if m.Session() == nil {
		return nil
	}
	_, err := m.Session().Claim(ctx, genesis, id, genesis, record.PhaseExecuting)
	return m.Err(err)
}

// Unclaim: see Claim.
func (m *Member) Unclaim(ctx context.Context, id string, genesis record.Address) {
	if m.Session() == nil {
		return
	}
	if err := m.Session().Remove(context.WithoutCancel(ctx), genesis); err != nil {
		m.cfg.Log.Error("fleet: the claim of a run never created is left; the next start removes it", "run", id, "err", err)
	}
}

// ownerTimeout bounds the directory read of Elsewhere.
const ownerTimeout = 5 * time.Second

// Elsewhere refuses, with fleet.ErrNotOwner, an operation on a run stored
// here that another host owns in the directory (an imported bundle whose
// claim was refused): its results, close and resume belong to that host.
// Alone, a run with no entry, or a directory out of reach, it refuses
// nothing: the fence still refuses every advance such a run would make.
func (m *Member) Elsewhere(id string) error {
	h := m.Session()
	if h == nil {
		return nil
	}
	st, err := m.cfg.Store.Run(id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ownerTimeout)
	defer cancel()
	e, err := h.Run(ctx, record.Genesis(st.Unit, st.Grants))
	if err != nil || e.Owner == h.Key() {
		return nil
	}
	return m.Err(fmt.Errorf("run %s: %w: host %s owns it", id, fleet.ErrNotOwner, e.Owner))
}
