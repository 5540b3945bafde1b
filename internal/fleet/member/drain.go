package member

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// DefaultDrainParallel is how many runs a drain moves at once unless told:
// as many as a host receives from one host at once (DefaultMaxReceives),
// so that no target refuses one of them as busy.
const DefaultDrainParallel = DefaultMaxReceives

// Drain moves every run this host holds (not closed, not handed off, not
// another host's) to the fleet's other hosts by migration: to, or every
// other host whose live session serves the fleet; each where it fits
// (docs/fleet.md, "Drain"). From its start this host refuses new runs
// (ErrDraining) until it restarts.
func (m *Member) Drain(ctx context.Context, to []record.Address, parallel int) ([]drain.Outcome, error) {
	if m.Session() == nil || m.cfg.Peers == nil {
		return nil, fmt.Errorf("drain: %w", ErrNoFleet)
	}
	m.draining.Store(true)
	runs, needs, err := m.Holding(ctx)
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	out, err := m.drainRuns(ctx, to, runs, needs, drain.Options{Parallel: parallel})
	if m.cfg.PostCopyWait > 0 {
		// The post-copy targets fetch the slabs of the parked runs sent
		// them: the drain ends once none fetches (WaitHolds), or at the
		// deadline.
		wctx, cancel := context.WithTimeout(ctx, m.cfg.PostCopyWait)
		if hs, _ := m.WaitHolds(wctx); len(hs) > 0 {
			m.cfg.Log.Warn("drain: runs still held for their post-copy targets", "runs", len(hs), "wait", m.cfg.PostCopyWait)
		}
		cancel()
	}
	return out, err
}

// Holding lists the runs this host holds — not closed, not handed off, not
// another host's — and what each needs of the host that takes it.
func (m *Member) Holding(ctx context.Context) ([]drain.Run, []drain.Need, error) {
	st := m.cfg.Store
	ids, err := st.AllRuns()
	if err != nil {
		return nil, nil, err
	}
	var runs []drain.Run
	var needs []drain.Need
	for _, id := range ids {
		r, err := st.Run(id)
		if err != nil {
			return nil, nil, err
		}
		if _, off, err := st.HandedOff(id); err != nil || off || r.Phase == record.PhaseClosed || m.Elsewhere(id) != nil {
			continue // not this host's to move
		}
		n, err := m.need(ctx, id)
		if err != nil {
			// Its migration judges it: placement cannot.
			m.cfg.Log.Warn("drain: the run is placed without judging its manifest", "run", id, "err", err)
			n = drain.Need{Run: id, ImagePark: n.ImagePark}
		}
		runs, needs = append(runs, drain.Run{ID: id, Transcript: !n.ImagePark, Bytes: n.Bytes}), append(needs, n)
	}
	return runs, needs, nil
}

// need is what stored run id asks of the host that takes it (Held.Need).
func (m *Member) need(ctx context.Context, id string) (drain.Need, error) {
	h, release, err := m.stored(id)()
	if err != nil {
		return drain.Need{}, err
	}
	defer release()
	return h.Need(ctx)
}

// drainRuns moves runs (with what each needs of the host that takes it) to
// the fleet's other hosts as opt says: to, or every other host whose live
// session serves the fleet. Before anything moves each host says what it
// can take (Peers.Offer), and internal/fleet/drain places each run on a host it
// fits (docs/fleet.md, "Drain"). Each run's outcome is a "drain.run" event
// as it ends (opt.Progress is set here).
func (m *Member) drainRuns(ctx context.Context, to []record.Address, runs []drain.Run, needs []drain.Need, opt drain.Options) ([]drain.Outcome, error) {
	if err := m.moving("drain", "this host"); err != nil {
		return nil, err
	}
	if err := m.Session().Drain(ctx); err != nil {
		// The host refuses runs all the same (its offer says so).
		m.cfg.Log.Warn("fleet: this host is not marked draining in the directory", "err", err)
	}
	if len(to) == 0 {
		var err error
		if to, err = m.otherHosts(ctx); err != nil {
			return nil, fmt.Errorf("drain: %w", err)
		}
	}
	if len(to) == 0 {
		return nil, fmt.Errorf("drain: %w: no other host serves the fleet", fleet.ErrNotAdmitted)
	}
	hosts := m.hostsFor(ctx, unique(to), needs)
	if opt.Migrate == nil {
		placed := map[record.Address]*placement{}
		for _, t := range hosts {
			placed[t.Key] = &placement{postCopy: t.PostCopy}
		}
		opt.Migrate = func(ctx context.Context, id string, to record.Address) error {
			return m.migrate(ctx, id, to, m.stored(id), placed[to])
		}
	}
	opt.Progress = func(o drain.Outcome, done, total int) {
		m.cfg.Metrics.Drained(o.Err == nil)
		detail := fmt.Sprintf("%d/%d moved to %s", done, total, o.To)
		if o.Err != nil {
			detail = fmt.Sprintf("%d/%d not moved: %v", done, total, o.Err)
		}
		m.cfg.Publish(events.Event{Kind: "drain.run", Run: o.Run, Detail: detail})
	}
	return drain.Drain(ctx, runs, hosts, opt), nil
}

// otherHosts are the fleet's hosts, other than this one, whose live
// session serves the fleet and is not being drained.
func (m *Member) otherHosts(ctx context.Context) ([]record.Address, error) {
	ms, err := m.Session().Hosts(ctx)
	if err != nil {
		return nil, err
	}
	var out []record.Address
	for _, h := range ms {
		if h.Role == fleet.RoleHost && h.Lease != 0 && h.Peer != "" && !h.Draining && h.Key != m.Session().Key() {
			out = append(out, h.Key)
		}
	}
	return out, nil
}

// OfferTimeout bounds how long a drain waits for one host's offer: a host
// that does not answer in time is offered nothing. (A variable: tests
// shorten it.)
var OfferTimeout = 15 * time.Second

// maxImageName is the longest image name a drain asks other hosts about;
// a run naming a longer one is judged by its migration.
const maxImageName = 1024

// hostsFor asks each of hosts for its offer, at once, and judges needs
// against each.
func (m *Member) hostsFor(ctx context.Context, hosts []record.Address, needs []drain.Need) []drain.Target {
	seen := map[string]bool{}
	var images []string
	for _, n := range needs {
		if n.Image != "" && len(n.Image) <= maxImageName && !seen[n.Image] {
			seen[n.Image] = true
			images = append(images, n.Image)
		}
	}
	out := make([]drain.Target, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() {
			octx, cancel := context.WithTimeout(ctx, OfferTimeout)
			defer cancel()
			o, err := m.cfg.Peers.Offer(octx, h, images)
			out[i] = drain.TargetOf(h, o, err, needs)
		})
	}
	wg.Wait()
	return out
}

// unique is keys, each once, in the order first given.
func unique(keys []record.Address) []record.Address {
	seen := map[record.Address]bool{}
	var out []record.Address
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}
