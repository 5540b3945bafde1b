package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// ErrDraining refuses a new run on a host being drained.
var ErrDraining = errors.New("this host is being drained")

// DefaultDrainParallel is how many runs a drain moves at once unless told.
const DefaultDrainParallel = 2

// Drain moves every run this host holds (not closed, not handed off) to
// the fleet's other hosts by migration (internal/drain decides the order
// and the placement; docs/fleet.md, "Drain"): to, or every other host
// whose live session serves the fleet. From its start this host refuses
// new runs (ErrDraining) until it restarts. Each run's outcome is a
// "drain.run" event as it ends.
func (d *Daemon) Drain(ctx context.Context, to []record.Address, parallel int) ([]drain.Outcome, error) {
	if d.session() == nil || d.cfg.Peers == nil {
		return nil, fmt.Errorf("drain: %w", ErrNoFleet)
	}
	d.draining.Store(true)
	if len(to) == 0 {
		var err error
		if to, err = d.otherHosts(ctx); err != nil {
			return nil, fmt.Errorf("drain: %w", err)
		}
	}
	if len(to) == 0 {
		return nil, fmt.Errorf("drain: %w: no other host serves the fleet", fleet.ErrNotAdmitted)
	}
	runs, needs, err := d.held(ctx)
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	hosts := d.hostsFor(ctx, to, needs)
	migrate := func(ctx context.Context, id string, to record.Address) error {
		_, err := d.Migrate(ctx, id, to)
		return err
	}
	return drain.Drain(ctx, runs, hosts, parallel, migrate, func(o drain.Outcome, done, total int) {
		d.metrics.Drained(o.Err == nil)
		detail := fmt.Sprintf("%d/%d moved to %s", done, total, o.To)
		if o.Err != nil {
			detail = fmt.Sprintf("%d/%d not moved: %v", done, total, o.Err)
		}
		d.publish(events.Event{Kind: "drain.run", Run: o.Run, Detail: detail})
	}), nil
}

// held lists the runs this host holds — not closed, not handed off — and
// what each needs of the host that takes it.
func (d *Daemon) held(ctx context.Context) ([]drain.Run, []drain.Need, error) {
	ids, err := d.st.AllRuns()
	if err != nil {
		return nil, nil, err
	}
	var runs []drain.Run
	var needs []drain.Need
	for _, id := range ids {
		s, err := d.Run(id)
		if err != nil {
			return nil, nil, err
		}
		if s.Phase == record.Ended || s.HandedOff {
			continue
		}
		r, n, err := d.need(ctx, id)
		if err != nil {
			return nil, nil, fmt.Errorf("run %s: %w", id, err)
		}
		runs, needs = append(runs, r), append(needs, n)
	}
	return runs, needs, nil
}

// otherHosts are the fleet's hosts, other than this one, whose live
// session serves the fleet.
func (d *Daemon) otherHosts(ctx context.Context) ([]record.Address, error) {
	ms, err := d.session().Hosts(ctx)
	if err != nil {
		return nil, err
	}
	var out []record.Address
	for _, m := range ms {
		if m.Role == fleet.RoleHost && m.Lease != 0 && m.Peer != "" && m.Key != d.session().Key() {
			out = append(out, m.Key)
		}
	}
	return out, nil
}
