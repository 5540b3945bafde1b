package daemon

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Adopt makes run id this host's when the host that owned it in the fleet
// is gone (its lease expired: fleet.Dir.Orphans lists it) and this host
// holds the run parked at the directory's head — a copy it imported, or a
// run it handed off — with everything its record reaches (docs/fleet.md,
// "Lost hosts"). The record is left as it is: it says nothing that did not
// happen. The run is checked first (its record from genesis, every object
// it reaches rehashed), then claimed in the fleet (refused unless its owner
// is gone and the directory's head is the record's: a lost host that went
// on further left a record this host does not have), then held here: it
// resumes here like any parked run.
func (d *Daemon) Adopt(ctx context.Context, id string) (Summary, error) {
	if d.session() == nil {
		return Summary{}, fmt.Errorf("adopt %s: %w", id, ErrNoFleet)
	}
	r, err := d.lockRun(id)
	if err != nil {
		return Summary{}, err
	}
	defer r.mu.Unlock()
	st, err := d.st.Run(id)
	if err != nil {
		return Summary{}, err
	}
	if err := phaseErr(id, st.Phase, record.Parked); err != nil {
		return Summary{}, err
	}
	if _, err := bundle.Verify(ctx, d.st, id, d.trusted, true); err != nil {
		return Summary{}, fmt.Errorf("adopt %s: %w", id, err)
	}
	genesis := record.Genesis(st.Unit, st.Grants)
	if _, err := d.session().Claim(ctx, genesis, id, st.Head, record.Parked); err != nil {
		return Summary{}, fmt.Errorf("adopt %s: %w", id, d.fleetErr(err))
	}
	if err := d.st.TakeOver(id, st.Head); err != nil {
		return Summary{}, fmt.Errorf("adopt %s: claimed, but not taken over in the store: %w", id, err)
	}
	d.log.Info("run adopted", "run", id, "head", st.Head)
	d.publish(events.Event{Kind: "run.adopted", Run: id})
	return d.summary(id, r)
}
