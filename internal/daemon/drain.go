package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ErrDraining refuses a new run on a host being drained.
var ErrDraining = errors.New("this host is being drained")

// Drained is one run's outcome in a drain: the host it moved to, or why
// no host took it.
type Drained struct {
	Run string
	To  record.Address // zero when it did not move
	Err error
}

// DefaultDrainParallel is how many runs a drain moves at once unless told.
const DefaultDrainParallel = 2

// Drain moves every run this host holds (not closed, not handed off) to
// the fleet's other hosts (docs/fleet.md, "Drain"), parallel at a time:
// transcript runs first, as they move no image; each to the first of the
// hosts that takes it, tried in turn from a different one for each run
// (to, or every other host with a live session serving the fleet). From
// its start this host refuses new runs (ErrDraining) until it restarts.
// Each run's outcome is published as a "drain.run" event as it ends.
func (d *Daemon) Drain(ctx context.Context, to []record.Address, parallel int) ([]Drained, error) {
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
	ids, err := d.drainOrder()
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	out := make([]Drained, len(ids))
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for range max(parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				out[i] = d.drainOne(ctx, ids[i], to, i)
				mu.Lock()
				done++
				d.publish(events.Event{Kind: "drain.run", Run: ids[i], Detail: drainDetail(out[i], done, len(ids))})
				mu.Unlock()
			}
		}()
	}
	for i := range ids {
		work <- i
	}
	close(work)
	wg.Wait()
	return out, nil
}

func drainDetail(r Drained, done, total int) string {
	if r.Err != nil {
		return fmt.Sprintf("%d/%d not moved: %v", done, total, r.Err)
	}
	return fmt.Sprintf("%d/%d moved to %s", done, total, r.To)
}

// drainOne moves run id to the first of to that takes it, starting at the
// k-th: a host that refuses it (its manifest does not match the run's, it
// cannot be reached) passes it to the next.
func (d *Daemon) drainOne(ctx context.Context, id string, to []record.Address, k int) Drained {
	var errs []error
	for j := range to {
		host := to[(k+j)%len(to)]
		if _, err := d.Migrate(ctx, id, host); err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		d.metrics.Drained(true)
		return Drained{Run: id, To: host}
	}
	d.metrics.Drained(false)
	return Drained{Run: id, Err: errors.Join(errs...)}
}

// drainOrder lists the runs this host holds, transcript runs first.
func (d *Daemon) drainOrder() ([]string, error) {
	ids, err := d.st.AllRuns()
	if err != nil {
		return nil, err
	}
	var transcript, image []string
	for _, id := range ids {
		s, err := d.Run(id)
		if err != nil {
			return nil, err
		}
		switch {
		case s.Phase == record.Ended || s.HandedOff:
		case s.Spec != nil && s.Spec.Mode == unit.TranscriptMode:
			transcript = append(transcript, id)
		default:
			image = append(image, id)
		}
	}
	return append(transcript, image...), nil
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
