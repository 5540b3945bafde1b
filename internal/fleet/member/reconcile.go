package member

import (
	"context"
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Reconcile makes this host's store and the fleet's directory agree
// at start, before the daemon reconciles containerd's sandboxes (docs/fleet.md,
// "Reconciling at start"; fleet.Reconcile decides). It returns the runs
// executing in this store that another host has now: their sandboxes are
// removed without an append. A run the directory cannot be asked about is
// left as it is — the fence refuses its appends until it is claimed.
func (m *Member) Reconcile(ctx context.Context) (elsewhere map[string]bool, err error) {
	f := m.Session()
	ids, err := m.cfg.Store.AllRuns()
	if err != nil {
		return nil, err
	}
	elsewhere = map[string]bool{}
	held := map[record.Address]bool{}
	for _, id := range ids {
		st, err := m.cfg.Store.Run(id)
		if err != nil {
			return nil, err
		}
		genesis := record.Genesis(st.Unit, st.Grants)
		held[genesis] = true
		var entry *fleet.Entry
		switch e, err := f.Run(ctx, genesis); {
		case err == nil:
			entry = &e
		case !errors.Is(err, fleet.ErrNoRun):
			return nil, fmt.Errorf("run %s: %w", id, err)
		}
		if entry != nil && entry.Owner == f.Key() && !entry.To.IsZero() && entry.To != f.Key() && entry.Head == st.Head {
			m.takeBackMigration(ctx, outbound{id: id, genesis: genesis, head: st.Head, to: entry.To}, st.Phase, elsewhere)
			continue
		}
		local := &fleet.Local{Head: st.Head, Phase: st.Phase}
		switch a := fleet.Reconcile(f.Key(), local, entry); a {
		case fleet.Register:
			// A copy, or a run this host handed off, is not live here: it
			// is never made this host's by being held (issue 33, L1).
			if _, held, err := m.cfg.Store.HandedOff(id); err != nil || held {
				if err != nil {
					m.cfg.Log.Error("fleet: whether the run is held handed off is unknown; not registered", "run", id, "err", err)
				}
				continue
			}
			if _, err := f.Claim(ctx, genesis, id, st.Head, st.Phase); err != nil {
				m.cfg.Log.Error("fleet: the run is not this host's until claimed", "run", id, "action", a, "err", err)
			}
		case fleet.Reclaim:
			if _, err := f.Claim(ctx, genesis, id, st.Head, st.Phase); err != nil {
				m.cfg.Log.Error("fleet: the run is not this host's until claimed", "run", id, "action", a, "err", err)
			}
		case fleet.Elsewhere:
			m.holdElsewhere(id, st.Head, st.Phase, elsewhere)
		case fleet.Diverged:
			m.cfg.Log.Error("fleet: the directory and the record disagree in a way the write order rules out; the run is held for the operator",
				"run", id, "head", st.Head, "entry", entry.Head, "entry_prev", entry.Prev)
		}
	}
	return elsewhere, m.removeLeftovers(ctx, held)
}

// takeBackMigration ends a migration out (o, the run in phase) that this
// host's last process did not finish (the run is transferred to o.to,
// which has not claimed it): the claim under this session takes the
// transfer back, and the migration's handoff in the store goes with it.
// If the other host claimed it first, the run is its, held here handed
// off.
func (m *Member) takeBackMigration(ctx context.Context, o outbound, phase record.Phase, elsewhere map[string]bool) {
	if _, err := m.Session().Claim(ctx, o.genesis, o.id, o.head, phase); err != nil {
		m.cfg.Log.Warn("fleet: a migration this host began was completed by its target", "run", o.id, "to", o.to, "err", err)
		m.holdElsewhere(o.id, o.head, phase, elsewhere)
		return
	}
	if err := m.cfg.Store.Reclaim(o.id, o.head); err != nil {
		m.cfg.Log.Error("fleet: a migration taken back, but not its handoff in the store", "run", o.id, "err", err)
	}
	m.cfg.Log.Warn("fleet: took back a migration the last process did not finish; the run is here, parked", "run", o.id, "to", o.to)
}

// holdElsewhere holds a run another host has: handed off here when it is
// parked; when it executes here its sandbox goes, without an append.
func (m *Member) holdElsewhere(id string, head record.Address, phase record.Phase, elsewhere map[string]bool) {
	switch phase {
	case record.PhaseParked:
		if err := m.cfg.Store.HandOff(id, head); err != nil {
			m.cfg.Log.Error("fleet: a run another host has is not held handed off here", "run", id, "err", err)
		}
	case record.PhaseExecuting:
		elsewhere[id] = true
	}
	m.cfg.Log.Warn("fleet: another host has the run; this host holds it no more", "run", id, "head", head)
}

// removeLeftovers removes the entries this key owns, still at their
// genesis, of runs no store here holds: a crash between a new run's claim
// and its creation.
func (m *Member) removeLeftovers(ctx context.Context, held map[record.Address]bool) error {
	f := m.Session()
	owned, err := f.Owned(ctx, f.Key())
	if err != nil {
		return err
	}
	for _, e := range owned {
		if held[e.Genesis] {
			continue
		}
		switch fleet.Reconcile(f.Key(), nil, &e) {
		case fleet.Leftover:
			_, err := f.Claim(ctx, e.Genesis, e.Run, e.Head, e.Phase)
			if err == nil {
				err = f.Remove(ctx, e.Genesis)
			}
			if err != nil {
				m.cfg.Log.Warn("fleet: a claim of a run never created is left", "run", e.Run, "err", err)
			}
		case fleet.Diverged:
			m.cfg.Log.Error("fleet: this key owns a run no store here holds", "run", e.Run, "genesis", e.Genesis)
		}
	}
	return nil
}
