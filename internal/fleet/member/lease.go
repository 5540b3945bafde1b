package member

import (
	"context"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
)

// GuardEvery is how often the lease guard looks at the lease.
const GuardEvery = 100 * time.Millisecond

// Watch starts, in wg until bg is done, the two watchers of a host in a
// fleet: the one that replaces a lost session (WatchLease) and the lease
// guard (GuardLease). Alone it starts nothing.
func (m *Member) Watch(bg context.Context, wg *sync.WaitGroup) {
	m.WatchLease(bg, wg)
	m.GuardLease(bg, wg)
}

// WatchLease replaces a session whose lease is lost (Config.Rejoin), in
// the background: until then the host appends and resumes nothing (the
// fence refuses); once rejoined it reconciles with the directory as at a
// start, claiming back the runs no other host took meanwhile, and drops
// the sandboxes of those another host took.
func (m *Member) WatchLease(bg context.Context, wg *sync.WaitGroup) {
	if m.cfg.Fleet == nil || m.cfg.Rejoin == nil {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			h := m.Session()
			select {
			case <-bg.Done():
				return
			case <-h.Done():
			}
			m.cfg.Log.Error("fleet: this host's lease is lost; it appends nothing until it rejoins", "err", h.Err())
			nh := m.rejoin(bg)
			if nh == nil {
				return
			}
			m.rejoined.Store(nh)
			if m.Draining() {
				if err := nh.Drain(bg); err != nil {
					m.cfg.Log.Warn("fleet: the new session is not marked draining", "err", err)
				}
			}
			elsewhere, err := m.Reconcile(bg)
			if err != nil {
				m.cfg.Log.Error("fleet: reconciling after the rejoin", "err", err)
			}
			m.drop(elsewhere)
			m.cfg.Log.Info("fleet: rejoined with a new session", "lease", nh.Lease())
		}
	}()
}

// rejoin tries Config.Rejoin every second until it succeeds, or bg is
// done (nil).
func (m *Member) rejoin(bg context.Context) *fleet.Session {
	for {
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		h, err := m.cfg.Rejoin(ctx)
		cancel()
		if err == nil {
			return h
		}
		m.cfg.Log.Warn("fleet: rejoin", "err", err)
		select {
		case <-bg.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// GuardLease freezes this host's executing units when its lease is about
// to lapse unconfirmed — less than a third of its time to live left: two
// renewals missed — and thaws them once it is confirmed again, by a
// renewal or a new session (docs/fleet.md, "A host without its lease").
// etcd cannot expire the lease, and so no other host adopt a run, before
// ValidUntil: by then every unit here is frozen. A run busy with an
// operation is left to it: the fence refuses its append meanwhile.
func (m *Member) GuardLease(bg context.Context, wg *sync.WaitGroup) {
	if m.cfg.Fleet == nil {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var thaw func(context.Context)
		t := time.NewTicker(GuardEvery)
		defer t.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case <-t.C:
			}
			h := m.Session()
			short := time.Until(h.ValidUntil()) < h.TTL()/3
			switch {
			case short && thaw == nil:
				thaw = m.freeze(bg) // nil when it froze none: tried again
			case !short && thaw != nil:
				thaw(bg)
				thaw = nil
			}
		}
	}()
}

// freeze pauses every unit executing here that no operation holds, and
// returns what thaws those still this host's (the same sandbox: one
// another host took meanwhile was dropped by the rejoin's reconcile); nil
// when it paused none.
func (m *Member) freeze(ctx context.Context) func(context.Context) {
	var thaws []func(context.Context)
	m.cfg.Runs.Idle(func(id string, h Held) {
		thaw, err := h.Freeze(ctx)
		if err != nil {
			m.cfg.Log.Error("fleet: a unit not frozen as the lease lapses", "run", id, "err", err)
		} else if thaw != nil {
			thaws = append(thaws, thaw)
		}
	})
	m.cfg.Log.Warn("fleet: the lease is lapsing unconfirmed; this host's units are frozen", "frozen", len(thaws))
	if len(thaws) == 0 {
		return nil
	}
	return func(ctx context.Context) {
		for _, thaw := range thaws {
			thaw(ctx)
		}
		m.cfg.Log.Info("fleet: the lease is confirmed again; this host's units are thawed")
	}
}

// drop destroys, without an append, the sandboxes here of runs ids, which
// another host took while this one was cut off (their units frozen here).
func (m *Member) drop(ids map[string]bool) {
	for id := range ids {
		h, release, err := m.cfg.Runs.Hold(id, false)
		if err != nil {
			continue // not stored here: nothing to drop
		}
		h.Drop()
		release()
	}
}
