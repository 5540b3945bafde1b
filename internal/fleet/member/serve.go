package member

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The peer routes' authorization (docs/fleet.md, "Peer routes"): what a
// host may ask of this one, beyond being an admitted host.

// ErrUnsolicited refuses a receive, or a read of a run's record or
// objects, that no transfer in the directory names: the run has no entry,
// its transfer names another target, its owner is not the calling host or
// its session is gone, or its head is not the one the caller names. A
// receive is refused before a byte is fetched.
var ErrUnsolicited = errors.New("no transfer names this host and run")

// ErrReceiving refuses a receive past the receives one host may have under
// way at once (Config.MaxReceives).
var ErrReceiving = errors.New("too many receives from this host at once")

// DefaultMaxReceives is how many receives one host may have under way here
// at once, unless Config.MaxReceives says otherwise.
const DefaultMaxReceives = 4

// grants are the transfers this host serves: for each target host, the
// runs handed to it and being taken now, each with every object its
// record reaches. A grant is made once the run is transferred and handed
// off (Migrate), and ends when the hand-over returns — the target has
// fetched every object and claimed the run, or refused it and the source
// took it back — or, for a run held for a post-copy target, at its Done
// (postcopy.go). A grant also says when its target last read one of its
// objects (or, made by a hand-over, was made): a post-copy target that
// did so within FetchIdle is fetching (WaitHolds).
type grants struct {
	mu  sync.Mutex
	by  map[record.Address]map[string]*grant
	gen int
}

type grant struct {
	id      int
	objects map[record.Address]bool
	read    time.Time // the last read of one of objects, or the grant's making by a hand-over
}

// grant lets host to read run id, whose record is rec, until the returned
// function is called; read is when the target is taken to have last
// read an object of it (a hand-over: now; a start's: never, the zero
// time).
func (m *Member) grant(to record.Address, id string, rec *record.Record, read time.Time) (func(), error) {
	objs, err := bundle.Reached(m.cfg.Store, rec, true)
	if err != nil {
		return nil, err
	}
	g := &grant{objects: make(map[record.Address]bool, len(objs)), read: read}
	for _, a := range objs {
		g.objects[a] = true
	}
	s := &m.serving
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[record.Address]map[string]*grant{}
	}
	if s.by[to] == nil {
		s.by[to] = map[string]*grant{}
	}
	s.gen++
	g.id = s.gen
	s.by[to][id] = g
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if cur := s.by[to][id]; cur != nil && cur.id == g.id {
			delete(s.by[to], id)
			if len(s.by[to]) == 0 {
				delete(s.by, to)
			}
		}
	}, nil
}

// end ends every grant of run id to host to.
func (s *grants) end(to record.Address, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.by[to], id)
	if len(s.by[to]) == 0 {
		delete(s.by, to)
	}
}

// ServesRecord says whether host key may read run id's record here: a
// transfer of the run to it is being served.
func (m *Member) ServesRecord(key record.Address, id string) error {
	s := &m.serving
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by[key][id] == nil {
		return fmt.Errorf("run %s to host %s: %w", id, key, ErrUnsolicited)
	}
	return nil
}

// ServesObject says whether host key may read object a here: a run being
// transferred to it reaches a. Each grant reaching a counts it as read
// now.
func (m *Member) ServesObject(key, a record.Address) error {
	s := &m.serving
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := false
	for _, g := range s.by[key] {
		if g.objects[a] {
			g.read, ok = time.Now(), true
		}
	}
	if !ok {
		return fmt.Errorf("object %s to host %s: %w", a, key, ErrUnsolicited)
	}
	return nil
}

// lastRead is when host to last read an object of run id (or the grant
// was made by a hand-over); the zero time if never, or not granted.
func (s *grants) lastRead(to record.Address, id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.by[to][id]; g != nil {
		return g.read
	}
	return time.Time{}
}

// fetching says whether host to read an object of run id (or the grant
// was made by a hand-over) within FetchIdle before now.
func (s *grants) fetching(to record.Address, id string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.by[to][id]
	return g != nil && now.Sub(g.read) < FetchIdle
}

// Serves says whether a transfer to host key is being served: it may ask
// which objects this host lacks.
func (m *Member) Serves(key record.Address) error {
	s := &m.serving
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.by[key]) == 0 {
		return fmt.Errorf("host %s: %w", key, ErrUnsolicited)
	}
	return nil
}

// counter counts what is under way, by host.
type counter struct {
	mu sync.Mutex
	n  map[record.Address]int
}

// take counts one more for key unless max are under way; the returned
// function counts it off.
func (c *counter) take(key record.Address, max int) (func(), bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] >= max {
		return nil, false
	}
	if c.n == nil {
		c.n = map[record.Address]int{}
	}
	c.n[key]++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.n[key]--; c.n[key] <= 0 {
			delete(c.n, key)
		}
	}, true
}

// ErrSending is a migration given up while this host had DefaultMaxReceives
// migrations under way to its target (sendSlots).
var ErrSending = errors.New("this host's migrations to the target are at their limit")

// sendSlots bounds the migrations this host has under way to each target
// at DefaultMaxReceives: the receives a target at its defaults takes from
// one host at once. Past them a target refuses a receive (ErrReceiving)
// after the source parked the run for it; a migration waits for a slot
// instead, before it holds or parks the run, so that a drain at its
// default, a concurrent migrate and a second drain share the target's
// room.
type sendSlots struct {
	mu sync.Mutex
	by map[record.Address]chan struct{}
}

// wait waits for a slot to target to (or ctx's end); release gives it back.
func (s *sendSlots) wait(ctx context.Context, to record.Address) (release func(), _ error) {
	s.mu.Lock()
	if s.by == nil {
		s.by = map[record.Address]chan struct{}{}
	}
	c := s.by[to]
	if c == nil {
		c = make(chan struct{}, DefaultMaxReceives)
		s.by[to] = c
	}
	s.mu.Unlock()
	select {
	case c <- struct{}{}:
		return sync.OnceFunc(func() { <-c }), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w (%d): waiting for one to end: %w", ErrSending, DefaultMaxReceives, ctx.Err())
	}
}

// solicited checks, before anything of the run is fetched, that the
// directory names this host the target of a transfer of it by from: the
// run has an entry, its To is this host, its owner is from under the
// session that claimed it (alive), and its head is the one from names. It
// returns what it read, for the claim (fleet.Session.ClaimSeen).
func (m *Member) solicited(ctx context.Context, from record.Address, h Handed) (fleet.Seen, error) {
	if h.Genesis.IsZero() || h.Head.IsZero() {
		return fleet.Seen{}, fmt.Errorf("%w: the hand-over names no genesis and head", ErrUnsolicited)
	}
	seen, err := m.Session().Transferred(ctx, h.Genesis, from)
	if errors.Is(err, fleet.ErrNoRun) {
		// Said, not wrapped: the refusal is the caller's (forbidden), not
		// a run this host lost (not_owner).
		return fleet.Seen{}, fmt.Errorf("%w: %v", ErrUnsolicited, err)
	}
	if err != nil {
		return fleet.Seen{}, err
	}
	e, lease := seen.Entry(), seen.OwnerLease()
	me := m.Session().Key()
	switch {
	case e.To != me:
		return fleet.Seen{}, fmt.Errorf("run %s: %w: its transfer names %q, not this host", h.Genesis, ErrUnsolicited, e.To)
	case e.Owner != from:
		return fleet.Seen{}, fmt.Errorf("run %s: %w: owned by %s, not the calling host %s", h.Genesis, ErrUnsolicited, e.Owner, from)
	case lease == 0 || lease != e.Lease:
		return fleet.Seen{}, fmt.Errorf("run %s: %w: its owner's session that claimed it (lease %x) is gone", h.Genesis, ErrUnsolicited, e.Lease)
	case e.Head != h.Head:
		return fleet.Seen{}, fmt.Errorf("run %s: %w: the directory holds head %s, the caller names %s", h.Genesis, ErrUnsolicited, e.Head, h.Head)
	}
	return seen, nil
}
