package member

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// ExpectFor is how long the rehash of a run's held objects that an
// expectation began (Expect) stands for the fetch that follows; older,
// the fetch rehashes them itself.
const ExpectFor = 2 * time.Minute

// expected is the one rehash ahead of a migration under way or done
// here, at most one at a time (Expect).
type expected struct {
	mu  sync.Mutex
	cur *expectation
}

type expectation struct {
	genesis, from record.Address
	done          chan struct{}
	// Set before done closes:
	ended time.Time
	ok    map[record.Address]bool
	// used: a fetch took it (under expected.mu).
	used bool
}

// Expect answers host from, which says it is about to hand run genesis
// here (POST /v1/migrations/expect, before the source parks the unit).
// from must own the run in the directory (else ErrUnsolicited). When
// this store holds a record of the run handed off (the run was here
// before), what that record reaches is rehashed in the background
// (transfer.RehashHeld), while the source parks: the fetch then skips
// what hashed to its address (FetchOptions.Rehashed). One rehash at a
// time, each for one fetch: while the last has run for less than
// ExpectFor and no fetch took it, an expectation of the same run, or from
// the same host, starts none; neither does one while it runs. It returns
// before the rehash ends.
func (m *Member) Expect(ctx context.Context, from, genesis record.Address) error {
	e, err := m.Session().Run(ctx, genesis)
	if errors.Is(err, fleet.ErrNoRun) {
		return fmt.Errorf("%w: %v", ErrUnsolicited, err)
	}
	if err != nil {
		return err
	}
	if e.Owner != from {
		return fmt.Errorf("run %s: %w: owned by %s, not the calling host %s", genesis, ErrUnsolicited, e.Owner, from)
	}
	run, ok, err := m.cfg.Store.RunOfGenesis(genesis)
	if err != nil || !ok {
		return err
	}
	if _, off, err := m.cfg.Store.HandedOff(run); err != nil || !off {
		return err
	}
	x := &m.expect
	x.mu.Lock()
	defer x.mu.Unlock()
	if c := x.cur; c != nil {
		select {
		case <-c.done:
			if !c.used && time.Since(c.ended) < ExpectFor && (c.genesis == genesis || c.from == from) {
				return nil
			}
		default:
			return nil // one at a time
		}
	}
	c := &expectation{genesis: genesis, from: from, done: make(chan struct{})}
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

// rehashed is what the expectation of run genesis rehashed, once it
// ended (waited for within ctx), while it stands (ExpectFor); nil when
// there is none.
func (x *expected) rehashed(ctx context.Context, genesis record.Address) func(record.Address) bool {
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
	if c.ok == nil || time.Since(c.ended) >= ExpectFor {
		return nil
	}
	x.mu.Lock()
	c.used = true
	x.mu.Unlock()
	return func(a record.Address) bool { return c.ok[a] }
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
