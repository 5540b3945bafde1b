package member

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Adopt makes run id this host's when the host that owned it in the fleet
// is gone (its lease expired: fleet.Dir.Orphans lists it) and this host
// holds the run parked at the directory's head — a copy it imported, or a
// run imported while another host owned it — with everything its record
// reaches (docs/fleet.md, "Lost hosts"). A run this host handed off
// itself is refused (store.ErrHandedOff), and so is one this host's key
// owns (fleet.Session.Adopt). The record is left as it is: it says nothing
// that did not happen. The run is checked first (its record from genesis,
// every object it reaches rehashed), then adopted in the fleet (refused
// unless its owner is another key whose lease is gone and the directory's
// head is the record's: a lost host that went on further left a record
// this host does not have), then held here: it resumes here like any
// parked run.
func (m *Member) Adopt(ctx context.Context, id string) error { return m.adopt(ctx, id, m.stored(id)) }

// adopt is Adopt, holding the run by hold.
func (m *Member) adopt(ctx context.Context, id string, hold Hold) error {
	if m.Session() == nil {
		return fmt.Errorf("adopt %s: %w", id, ErrNoFleet)
	}
	_, release, err := hold()
	if err != nil {
		return err
	}
	defer release()
	st, err := m.cfg.Store.Run(id)
	if err != nil {
		return err
	}
	switch st.Phase {
	case record.PhaseClosed:
		return fmt.Errorf("run %s: %w", id, record.ErrClosed)
	case record.PhaseExecuting:
		return fmt.Errorf("run %s: %w", id, record.ErrNotParked)
	}
	// A handoff this host made (an export, a migration out) is not
	// adopted: the bundle or the target holds the run, and only
	// `import --reclaim` of that very bundle, or the migration's own
	// take-back, brings it back (issue 33, L1).
	switch h, held, err := m.cfg.Store.HandedOff(id); {
	case err != nil:
		return err
	case held && !h.Copy:
		return fmt.Errorf("adopt %s: %w: this host handed it off itself; take it back with import --reclaim", id, store.ErrHandedOff)
	}
	if _, err := bundle.Verify(ctx, m.cfg.Store, id, m.cfg.Import.Trusted, true); err != nil {
		return fmt.Errorf("adopt %s: %w", id, err)
	}
	genesis := record.Genesis(st.Unit, st.Grants)
	if _, err := m.Session().Adopt(ctx, genesis, id, st.Head, record.PhaseParked); err != nil {
		return fmt.Errorf("adopt %s: %w", id, m.Err(err))
	}
	if err := m.cfg.Store.TakeOver(id, st.Head); err != nil {
		return fmt.Errorf("adopt %s: claimed, but not taken over in the store: %w", id, err)
	}
	m.cfg.Log.Info("run adopted", "run", id, "head", st.Head)
	m.cfg.Publish(events.Event{Kind: "run.adopted", Run: id})
	return nil
}
