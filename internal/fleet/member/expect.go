package member

import (
	"context"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// expected is the one rehash ahead of a migration under way or done
// here, at most one at a time (Expect).
type expected struct {
	mu  sync.Mutex
	cur *expectation
}

type expectation struct {
	genesis record.Address
	done    chan struct{}
	// Set before done closes:
	ended time.Time
	ok    map[record.Address]time.Time
	// used: a fetch took it (under expected.mu).
	used bool
}

// busy says whether a rehash runs, or ended less than
// transfer.RehashedFor ago and no fetch took it: then no other starts.
// Under x.mu.
func (x *expected) busy() bool {
	c := x.cur
	if c == nil {
		return false
	}
	select {
	case <-c.done:
		return !c.used && time.Since(c.ended) < transfer.RehashedFor
	default:
		return true
	}
}

// Expect answers host from, which says it is about to hand run genesis
// here (POST /v1/migrations/expect, before the source parks the unit).
// When this store holds a record of the run handed off (the run was here
// before), this host takes runs, no other rehash is busy (one runs, or
// one that ended less than transfer.RehashedFor ago no fetch took), and
// from owns the run in the directory, it rehashes what that record
// reaches in the background (transfer.RehashHeld) while the source parks:
// the next fetch of the run waits for it and skips what hashed to its
// address (FetchOptions.Rehashed). Whether it began one is not said: the
// answer is the same whatever follows (only its time may differ). It
// returns before the rehash ends.
func (m *Member) Expect(ctx context.Context, from, genesis record.Address) error {
	if err := m.moving("expect", genesis.String()); err != nil {
		return err
	}
	run, ok, err := m.cfg.Store.RunOfGenesis(genesis)
	if err != nil || !ok || m.Draining() {
		return nil
	}
	if _, off, err := m.cfg.Store.HandedOff(run); err != nil || !off {
		return nil
	}
	x := &m.expect
	x.mu.Lock()
	busy := x.busy()
	x.mu.Unlock()
	if busy {
		return nil
	}
	if e, err := m.Session().Run(ctx, genesis); err != nil || e.Owner != from {
		m.cfg.Log.Debug("migrate: an expectation whose caller is not known to own the run starts nothing", "genesis", genesis, "from", from, "err", err)
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.busy() {
		return nil
	}
	c := &expectation{genesis: genesis, done: make(chan struct{})}
	pp := &m.paying // the member's background work: ended by EndFetches
	pp.mu.Lock()
	started := pp.start(func(ctx context.Context) {
		defer close(c.done)
		t0 := time.Now()
		ok, err := transfer.RehashHeld(ctx, m.cfg.Store, genesis)
		c.ok, c.ended = ok, time.Now()
		m.cfg.Log.Debug("migrate: rehashed the objects held for an expected run", "genesis", genesis, "objects", len(ok), "took", time.Since(t0), "err", err)
	})
	pp.mu.Unlock()
	if started {
		x.cur = c
	}
	return nil
}

// rehashed is what the expectation of run genesis rehashed, for one
// fetch: it waits (within ctx) for the rehash to end, and gives it to the
// first fetch that asks, if it ended less than transfer.RehashedFor ago
// (each object's age is judged again when the import asks:
// transfer.Fetched.Rehashed); nil otherwise.
func (x *expected) rehashed(ctx context.Context, genesis record.Address) func(record.Address) (time.Time, bool) {
	x.mu.Lock()
	c := x.cur
	x.mu.Unlock()
	if c == nil || c.genesis != genesis {
		return nil
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.cur != c || c.used || c.ok == nil || time.Since(c.ended) >= transfer.RehashedFor {
		return nil
	}
	c.used = true
	return func(a record.Address) (time.Time, bool) {
		at, ok := c.ok[a]
		return at, ok
	}
}

// expectTimeout bounds the source's word to the target (expected).
const expectTimeout = 5 * time.Second

// expected tells host to, in the background, that run id is about to be
// handed to it (Peers.Expect), as the unit is parked for it: a target
// that held the run rehashes its objects meanwhile. Its answer, and an
// error (an older target lacks the route), change nothing.
func (m *Member) expected(to record.Address, id string) {
	st, err := m.cfg.Store.Run(id)
	if err != nil {
		return
	}
	genesis := record.Genesis(st.Unit, st.Grants)
	pp := &m.paying
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.start(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, expectTimeout)
		defer cancel()
		if err := m.cfg.Peers.Expect(ctx, to, genesis); err != nil {
			m.cfg.Log.Debug("migrate: the target was not told the run is coming", "run", id, "to", to, "err", err)
		}
	})
}
