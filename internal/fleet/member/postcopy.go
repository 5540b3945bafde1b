package member

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Post-copy migration of a parked run (docs/fleet.md, "Post-copy"). The
// target (Config.PostCopy) stores and claims the run before the slabs of
// its last memory image are here, answers, then brings them in, each
// chunk verified against its index record and each slab as a whole
// (transfer.Owed), and tells the source (Peers.Done). The source keeps a
// hold on the run (store.AddHold: durable, a pin to retention) and serves
// its objects to the target until then.

// payers are the post-copy receives bringing their slabs in: one
// background fetch per run at a time, which a resume waits on
// (Member.Pay). A run's payer lives while a fetch of it runs or someone
// waits on it.
type payers struct {
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool // no background work starts (close)
	runs   map[string]*payer
}

type payer struct {
	turn chan struct{} // holds a token while a fetch is under way
	wake chan struct{} // cuts a background fetch's wait before its next try short
	// Under payers.mu:
	refs   int      // acquire's callers not released yet
	bg     bool     // a background fetch runs
	next   *attempt // what waits for the end of the background's next try
	trying bool     // the background's try is under way
	failed error    // the background's last try's error, if it failed
	tried  time.Time
	// mismatches counts the tries in a row whose source's bytes were
	// verified wrong (transfer.ErrMismatch); a try that adopts a slab
	// restarts it.
	mismatches int
	// set is the owed slabs being filled, while a fetch or a lazy resume
	// holds them (owedSet).
	set *owedSet
}

// attempt is one try of a background fetch, as a resume waits on it.
type attempt struct {
	done chan struct{} // closed once err is set
	err  error
}

// lock takes the run's turn to fetch, or gives up when ctx ends (a
// resume does not outwait a stalled source).
func (p *payer) lock(ctx context.Context) error {
	select {
	case p.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *payer) unlock() { <-p.turn }

// acquire is run id's payer, kept until release is called.
func (p *payers) acquire(id string) (_ *payer, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runs == nil {
		p.runs = map[string]*payer{}
	}
	q := p.runs[id]
	if q == nil {
		q = &payer{turn: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
		p.runs[id] = q
	}
	q.refs++
	return q, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if q.refs--; q.refs == 0 && !q.bg && p.runs[id] == q {
			delete(p.runs, id)
		}
	}
}

// start runs f in the background (its context ends with close) unless
// the payers are closed, and says whether it did; p.mu held.
func (p *payers) start(f func(ctx context.Context)) bool {
	if p.closed {
		return false
	}
	p.wg.Go(func() { f(p.ctx) })
	return true
}

// close ends the background work and waits for it; none starts after.
func (p *payers) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.stop()
	p.wg.Wait()
}

// payRetry bounds the wait between two background fetches of a run's
// slabs whose source could not serve them; payNoSpace is the wait after
// one the store had no room for (transfer.ErrNoSpace).
const (
	payRetry   = 30 * time.Second
	payNoSpace = 5 * time.Minute
)

// StrandAfter is how many tries in a row may bring bytes of an owed slab
// that do not hash to their verified address (transfer.ErrMismatch: a
// damaged or hostile source) before the owing is stranded. A try that
// fails otherwise (the link, a timeout, no room) neither counts nor
// restarts the count; one that adopts a slab restarts it.
const StrandAfter = 5

// payLater brings run id's owed slabs in, in the background, until it
// holds them and its source was told, trying again (1 s, doubling to
// payRetry; payNoSpace after a try the store had no room for) while it
// cannot, each failed try logged. It says whether a background fetch of
// the run runs (none starts once the member is closed).
func (m *Member) payLater(id string) bool {
	pp := &m.paying
	p, release := pp.acquire(id)
	pp.mu.Lock()
	if p.bg {
		pp.mu.Unlock()
		release()
		return true
	}
	p.bg = pp.start(func(ctx context.Context) {
		var err error
		defer func() {
			pp.mu.Lock()
			p.bg = false
			if a := p.next; a != nil {
				// Waited on while this ended: its last word.
				p.next, a.err = nil, err
				close(a.done)
			}
			pp.mu.Unlock()
			release()
		}()
		wait := time.Second
		for {
			pp.mu.Lock()
			p.trying = true
			pp.mu.Unlock()
			err = m.payOnce(ctx, id)
			pp.mu.Lock()
			p.trying, p.failed, p.tried = false, err, time.Now()
			if a := p.next; a != nil {
				p.next, a.err = nil, err
				close(a.done)
			}
			pp.mu.Unlock()
			if err == nil || ctx.Err() != nil || errors.Is(err, store.ErrStranded) {
				return // a stranded owing is not tried again (logged once, by strand)
			}
			w := wait
			if errors.Is(err, transfer.ErrNoSpace) {
				w = payNoSpace
			} else {
				wait = min(2*wait, payRetry)
			}
			m.cfg.Log.Warn("post-copy: the run's slabs are not all here; trying again", "run", id, "in", w, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
			case <-time.After(w):
			}
		}
	})
	started := p.bg
	pp.mu.Unlock()
	if !started {
		release()
	}
	return started
}

// Pay makes sure run id holds every slab a post-copy migration owes it:
// it has the background fetch of them try now (payLater) and waits for
// that try's end, or ctx's (the fetch goes on). Refused (store.ErrOwed,
// with why) when the try fails: the source cannot serve them now; and at
// once, with store.ErrStranded too, when the owing is stranded. A resume
// calls it first.
func (m *Member) Pay(ctx context.Context, id string) error {
	if err := m.cfg.Store.Owes(id); err == nil || !errors.Is(err, store.ErrOwed) || errors.Is(err, store.ErrStranded) {
		return err // a stranded owing: refused at once, nothing fetched
	}
	pp := &m.paying
	p, release := pp.acquire(id)
	defer release()
	pp.mu.Lock()
	a := p.next
	if a == nil {
		a = &attempt{done: make(chan struct{})}
		p.next = a
	}
	pp.mu.Unlock()
	if !m.payLater(id) {
		return fmt.Errorf("%w: the daemon stops", store.ErrOwed)
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	switch {
	case a.err == nil:
		return m.cfg.Store.Owes(id)
	case errors.Is(a.err, store.ErrOwed):
		return a.err
	default:
		return fmt.Errorf("%w: %w", store.ErrOwed, a.err)
	}
}

// Reserved is the room the store's filesystem owes post-copy migrations:
// the bytes of the slabs owed to runs stored here not held yet
// (store.OwedBytes), and to receives fetched and not stored yet. A
// receive's room (free) and the placement offer's leave it out.
func (m *Member) Reserved() (uint64, error) {
	n, err := m.cfg.Store.OwedBytes()
	return n + uint64(max(m.arriving.Load(), 0)), err
}

// free is the room a received run's objects may take: the store's
// filesystem's past --min-free (park.Free), less Reserved.
func (m *Member) free() (uint64, error) {
	f, err := park.Free(m.cfg.Store, m.cfg.MinFree)
	if err != nil {
		return 0, err
	}
	r, err := m.Reserved()
	if err != nil {
		return 0, err
	}
	return f - min(f, r), nil
}

// OwingRun is a run a post-copy migration brings in here that still owes
// slabs (Owings), and where its fetch is.
type OwingRun struct {
	Run string
	// Source is the key id of the host serving its slabs; Head the head
	// it was handed over at.
	Source, Head record.Address
	Slabs        int // slabs owed
	State        OwingState
	// Reason is the last try's error (OwingWaiting), at Tried; or why
	// the owing is stranded (OwingStranded), since Tried.
	Reason string
	Tried  time.Time
}

// OwingState is where an owing run's fetch is.
type OwingState string

// An owing run's fetch is under way (fetching), waits to try again after
// a try that failed (waiting), or runs not (stopped: the daemon serves
// alone, or stops; stranded: its source can serve the slabs no more,
// store.Strand, and only the run's close ends the owing).
const (
	OwingFetching OwingState = "fetching"
	OwingWaiting  OwingState = "waiting"
	OwingStopped  OwingState = "stopped"
	OwingStranded OwingState = "stranded"
)

// Owings lists the runs that owe slabs here, each with its fetch's state.
func (m *Member) Owings() ([]OwingRun, error) {
	st := m.cfg.Store
	ids, err := st.OwedRuns()
	if err != nil {
		return nil, err
	}
	out := make([]OwingRun, 0, len(ids))
	for _, id := range ids {
		o, ok, err := st.Owed(id)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // its owing ended meanwhile
		}
		r, err := m.owingRun(id, o)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// OwingOf is run id's owing, with its fetch's state, if it owes slabs.
func (m *Member) OwingOf(id string) (OwingRun, bool, error) {
	o, ok, err := m.cfg.Store.Owed(id)
	if err != nil || !ok {
		return OwingRun{}, false, err
	}
	r, err := m.owingRun(id, o)
	return r, err == nil, err
}

// owingRun is run id, owing o, with its fetch's state.
func (m *Member) owingRun(id string, o store.Owing) (OwingRun, error) {
	r := OwingRun{Run: id, Source: o.Source, Head: o.Head, Slabs: len(o.Slabs), State: OwingStopped}
	sd, stranded, err := m.cfg.Store.StrandOf(id)
	if err != nil || stranded {
		r.State, r.Reason, r.Tried = OwingStranded, sd.Reason, sd.Since
		return r, err
	}
	pp := &m.paying
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if p := pp.runs[id]; p != nil && p.bg {
		switch {
		case p.trying:
			r.State = OwingFetching
		case p.failed != nil:
			r.State, r.Reason, r.Tried = OwingWaiting, p.failed.Error(), p.tried
		default:
			r.State = OwingFetching // started, its first try not begun
		}
	}
	return r, nil
}

// Owing says whether run id is one a post-copy migration brings in here
// and its source was not told yet it holds it.
func (m *Member) Owing(id string) (bool, error) {
	_, ok, err := m.cfg.Store.Owed(id)
	return ok, err
}

// payOnce fetches, adopts and settles each slab run id owes, then tells
// its source and ends the owing. A slab adopted already is settled only.
// A run handed off, or closed, ends its owing without fetching; a
// stranded one is refused (store.ErrStranded). Before it fetches, it asks
// the source whether it still holds the run for this host (askHeld), and
// strands the owing if it does not; and after StrandAfter tries in a row
// whose source's bytes were verified wrong.
func (m *Member) payOnce(ctx context.Context, id string) error {
	p, release := m.paying.acquire(id)
	defer release()
	if err := p.lock(ctx); err != nil {
		return err
	}
	defer p.unlock()
	st := m.cfg.Store
	o, ok, err := st.Owed(id)
	if err != nil || !ok {
		return err
	}
	if _, off, err := st.HandedOff(id); err != nil {
		return err
	} else if off {
		// Held elsewhere now: its slabs are not this host's to bring; one
		// holding them all tells its source first (in a fleet still),
		// whose hold then ends.
		if len(o.Slabs) == 0 && m.moving("post-copy", id) == nil {
			if err := m.tell(ctx, id, o); err != nil {
				return err
			}
		}
		return st.Abandon(id)
	}
	if run, err := st.Run(id); err != nil {
		return err
	} else if run.Phase == record.PhaseClosed {
		// Closed: never resumed, its slabs are not needed. Its source is
		// told it needs nothing more (its hold ends) when it can be; the
		// owing ends either way, and retention may release the run.
		if m.moving("post-copy", id) == nil {
			if err := m.tell(ctx, id, o); err != nil {
				m.cfg.Log.Warn("post-copy: the closed run's source is not told; its hold there expires", "run", id, "from", o.Source, "err", err)
			}
		}
		if err := st.Abandon(id); err != nil {
			return err
		}
		m.cfg.Log.Info("post-copy: the run is closed; its owed slabs are not brought in", "run", id, "from", o.Source, "owed", len(o.Slabs))
		return nil
	}
	if sd, stranded, err := st.StrandOf(id); err != nil {
		return err
	} else if stranded {
		return fmt.Errorf("post-copy %s from %s: %w: %s", id, o.Source, store.ErrStranded, sd.Reason)
	}
	if m.moving("post-copy", id) != nil {
		// Served alone now (no --etcd or --peer-listen): no source to ask.
		return fmt.Errorf("post-copy %s from %s: %w", id, o.Source, ErrNoFleet)
	}
	if slices.ContainsFunc(o.Slabs, func(a record.Address) bool { return !st.Has(a) }) {
		if err := m.askHeld(ctx, id, o); err != nil {
			return err
		}
	}
	if len(o.Slabs) > 0 {
		adopted, err := m.fill(ctx, id, o)
		m.paying.mu.Lock()
		if adopted > 0 {
			p.mismatches = 0
		}
		if errors.Is(err, transfer.ErrMismatch) {
			p.mismatches++
		}
		n := p.mismatches
		m.paying.mu.Unlock()
		if errors.Is(err, transfer.ErrMismatch) && n >= StrandAfter {
			return m.strand(id, o, fmt.Sprintf("%d tries in a row brought slab bytes from host %s that do not hash to their verified addresses; the last: %v", n, o.Source, err))
		}
		if err != nil {
			return err
		}
	}
	if err := m.tell(ctx, id, o); err != nil {
		return err
	}
	m.reach("postcopy.told")
	if err := st.Discharge(id); err != nil {
		return err
	}
	m.cfg.Log.Info("post-copy: every slab of the run is here", "run", id, "from", o.Source)
	m.cfg.Publish(events.Event{Kind: "run.received", Run: id, Detail: o.Source.String()})
	return nil
}

// tell tells run id's source, o.Source, that this host holds every slab
// of it, or needs none (closed) (Peers.Done).
func (m *Member) tell(ctx context.Context, id string, o store.Owing) error {
	run, err := m.cfg.Store.Run(id)
	if err != nil {
		return err
	}
	if err := m.cfg.Peers.Done(ctx, o.Source, Handed{Run: id, Genesis: record.Genesis(run.Unit, run.Grants), Head: o.Head}); err != nil {
		return fmt.Errorf("post-copy: telling host %s: %w", o.Source, err)
	}
	return nil
}

// fill brings in each slab of o, from its source, and settles it; it
// returns how many it adopted. Each slab is brought in only if the
// store's filesystem keeps its minimum free space past it
// (transfer.ErrNoSpace: tried again later).
func (m *Member) fill(ctx context.Context, id string, o store.Owing) (adopted int, _ error) {
	if failpoint.Fails("postcopy.fill") {
		return 0, fmt.Errorf("post-copy %s: %w: the failpoint postcopy.fill", id, transfer.ErrPeer)
	}
	st := m.cfg.Store
	slabs, err := owedSlabs(st, o)
	if err != nil {
		return 0, err
	}
	p, releasePayer := m.paying.acquire(id)
	defer releasePayer()
	set, release, err := m.owedSet(p, o.Source)
	if err != nil {
		return 0, err
	}
	defer release()
	for _, s := range slabs {
		if !st.Has(s.Slab.Address) {
			free, err := park.Free(st, m.cfg.MinFree)
			if err != nil {
				return adopted, err
			}
			if free < s.Slab.Size {
				return adopted, fmt.Errorf("post-copy %s: slab %s: %w: %d bytes, %d left past the minimum free space (--min-free)", id, s.Slab.Address, transfer.ErrNoSpace, s.Slab.Size, free)
			}
			ow, err := set.slab(st, s)
			if err != nil {
				return adopted, err
			}
			err = ow.Fill(ctx)
			if err == nil {
				err = ow.Adopt(ctx, st)
			}
			if err != nil {
				return adopted, err
			}
			adopted++
			m.reach("postcopy.adopted")
		}
		if err := st.Settle(ctx, id, s.Slab.Address); err != nil {
			return adopted, err
		}
	}
	return adopted, nil
}

// askHeldTimeout bounds a source's answer to askHeld: one that stalls is
// "unknown", and the try goes on to fetch. A variable: tests shorten it.
var askHeldTimeout = 30 * time.Second

// askHeld asks run id's source whether it still holds the run for this
// host at o.Head (Peers.Held), and strands the owing when it says it does
// not. Any other outcome — held, an error, an older source without the
// route — leaves the owing to the fetch.
func (m *Member) askHeld(ctx context.Context, id string, o store.Owing) error {
	run, err := m.cfg.Store.Run(id)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, askHeldTimeout)
	held, err := m.cfg.Peers.Held(actx, o.Source, Handed{Run: id, Genesis: record.Genesis(run.Unit, run.Grants), Head: o.Head})
	cancel()
	if err != nil || held {
		return nil
	}
	return m.strand(id, o, fmt.Sprintf("host %s holds the run for this host no more (it answered held: false)", o.Source))
}

// strand marks run id's owing o stranded for reason (store.Strand), logs
// it once, and returns the refusal (store.ErrStranded): no fetch tries it
// again, and the run's close ends it (Closed).
func (m *Member) strand(id string, o store.Owing, reason string) error {
	if err := m.cfg.Store.Strand(id, reason); err != nil {
		return err
	}
	m.cfg.Log.Warn("post-copy: the run's owing is stranded: its slabs are fetched no more, the run is not resumed here; close it to end the owing", "run", id, "from", o.Source, "owed", len(o.Slabs), "reason", reason)
	return fmt.Errorf("post-copy %s from %s: %w: %s", id, o.Source, store.ErrStranded, reason)
}

// Closed ends run id's owing, if it owes, now that the run is closed: a
// try of its own (payOnce, after any under way) tells the source and
// ends the owing — a stranded owing's too, which no fetch tries again,
// even one a try under way strands after the close. A background fetch
// waiting to try again is woken (its try finds no owing).
func (m *Member) Closed(id string) {
	if _, ok, err := m.cfg.Store.Owed(id); err != nil || !ok {
		return
	}
	pp := &m.paying
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.start(func(ctx context.Context) {
		if err := m.payOnce(ctx, id); err != nil && ctx.Err() == nil {
			m.cfg.Log.Warn("post-copy: the closed run's owing is not ended; the next start ends it", "run", id, "err", err)
		}
	})
	if p := pp.runs[id]; p != nil {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// Held answers the host whose key is key, a post-copy target asking
// whether this host still holds run h.Run for it (POST
// /v1/migrations/held): true only when the run's hold is key's at h.Head
// and the run's genesis is h.Genesis, as Done compares. Any other asker
// is answered false, as for a run not held: it learns nothing of holds
// not its own.
func (m *Member) Held(key record.Address, h Handed) (bool, error) {
	st := m.cfg.Store
	hold, ok, err := st.HoldOf(h.Run)
	if err != nil || !ok || hold.Target != key || hold.Head != h.Head {
		return false, err
	}
	run, err := st.Run(h.Run)
	if err != nil {
		return false, err
	}
	return record.Genesis(run.Unit, run.Grants) == h.Genesis, nil
}

// owedSlabs are o's slabs with their chunks, from the verified indexes of
// the listings naming them.
func owedSlabs(st *store.Store, o store.Owing) ([]transfer.OwedSlab, error) {
	var out []transfer.OwedSlab
	for _, l := range o.Listings {
		es, err := st.Listing(l)
		if err != nil {
			return nil, err
		}
		cfs, err := store.ChunkedFiles(es, st.ReadIndex)
		if err != nil {
			return nil, err
		}
		for _, s := range transfer.OwedSlabs(cfs, o.Slabs) {
			if !slices.ContainsFunc(out, func(x transfer.OwedSlab) bool { return x.Slab.Address == s.Slab.Address }) {
				out = append(out, s)
			}
		}
	}
	if len(out) != len(o.Slabs) {
		return nil, fmt.Errorf("post-copy: %w: %d slabs owed, %d found in the run's listings", store.ErrDamaged, len(o.Slabs), len(out))
	}
	return out, nil
}

// lastSlabbed says whether rec's last park holds a memory image with a
// slab: a post-copy target may owe it.
func lastSlabbed(st *store.Store, rec *record.Record) bool {
	if rec.Len() == 0 {
		return false
	}
	s := rec.Segment(rec.Len() - 1)
	if s.Kind != record.Suspended || s.Snapshot.IsTranscript() || s.Snapshot.Memory == nil {
		return false
	}
	es, err := st.Listing(*s.Snapshot.Memory)
	if err != nil {
		return false
	}
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	return err == nil && slices.ContainsFunc(cfs, func(cf store.ChunkedFile) bool { return len(cf.Slabs) > 0 })
}

// Done ends the hold on run h.Run for host key, which says it holds every
// object of it (POST /v1/migrations/done): only the hold's target, at
// the head and genesis it was handed over at, ends it. A run with no hold
// is a no-op (a second call, or a target that owed nothing).
func (m *Member) Done(key record.Address, h Handed) error {
	st := m.cfg.Store
	hold, ok, err := st.HoldOf(h.Run)
	if err != nil || !ok {
		return err
	}
	run, err := st.Run(h.Run)
	if err != nil {
		return err
	}
	if hold.Target != key || hold.Head != h.Head || record.Genesis(run.Unit, run.Grants) != h.Genesis {
		return fmt.Errorf("run %s: %w: held for host %s at %s", h.Run, ErrUnsolicited, hold.Target, hold.Head)
	}
	if _, err := st.DropHold(h.Run, key, h.Head); err != nil {
		return err
	}
	m.serving.end(key, h.Run)
	m.cfg.Log.Info("post-copy: the target holds the run; its hold here ends", "run", h.Run, "to", key, "held", time.Since(hold.Since).Round(time.Millisecond))
	return nil
}

// GoOn goes on, at start (after Reconcile), with the post-copy migrations
// a stop left under way: it serves each run held here to its target, and
// brings in the slabs each run received here owes. A hold on a run not
// handed off here at the hold's head (the stop came before the target
// claimed it and the run was taken back, or it has moved since) ends, and
// so does one older than HoldLife; the holds' ages are checked every
// HoldSweep from then on.
func (m *Member) GoOn() error {
	m.expireHolds(time.Now())
	holds, err := m.cfg.Store.Holds()
	if err != nil {
		return err
	}
	for _, h := range holds {
		ho, off, err := m.cfg.Store.HandedOff(h.Run)
		if err == nil && (!off || ho.Copy || ho.Head != h.Head) {
			if _, err := m.cfg.Store.DropHold(h.Run, h.Target, h.Head); err != nil {
				m.cfg.Log.Warn("post-copy: the hold of a run not handed off at its head stays", "run", h.Run, "to", h.Target, "err", err)
			}
			continue
		}
		var rec *record.Record
		if err == nil {
			rec, err = m.cfg.Store.Record(h.Run)
		}
		if err == nil {
			_, err = m.grant(h.Target, h.Run, rec, time.Time{})
		}
		if err != nil {
			m.cfg.Log.Warn("post-copy: a held run is not served", "run", h.Run, "to", h.Target, "err", err)
		}
	}
	owed, err := m.cfg.Store.OwedRuns()
	if err != nil {
		return err
	}
	for _, id := range owed {
		m.payLater(id)
	}
	m.paying.mu.Lock()
	m.paying.start(func(ctx context.Context) {
		t := time.NewTicker(HoldSweep)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				m.expireHolds(now)
			}
		}
	})
	m.paying.mu.Unlock()
	return nil
}

// HoldLife is how long a hold lasts after it was made or its target last
// read an object of it: a target that has not said it holds the run by
// then (it owed nothing and its answer was lost, or it is gone) is served
// the run's objects no more, and the run's snapshots are retention's
// again. HoldSweep is how often the holds' ages are checked, each read
// since the last check kept in the store then (Store.RenewHold).
const (
	HoldLife  = 7 * 24 * time.Hour
	HoldSweep = time.Hour
)

// expireHolds renews each hold its target read since its Since, and ends
// each made or last read more than HoldLife before now, logged.
func (m *Member) expireHolds(now time.Time) {
	holds, err := m.cfg.Store.Holds()
	if err != nil {
		m.cfg.Log.Warn("post-copy: the holds' ages are not checked", "err", err)
		return
	}
	for _, h := range holds {
		if read := m.serving.lastRead(h.Target, h.Run); read.After(h.Since) {
			if _, err := m.cfg.Store.RenewHold(h.Run, h.Target, h.Head, read); err != nil {
				m.cfg.Log.Warn("post-copy: the hold's renewal by its target's read is not kept", "run", h.Run, "to", h.Target, "err", err)
			}
			h.Since = read
		}
		if now.Sub(h.Since) <= HoldLife {
			continue
		}
		if ok, err := m.cfg.Store.DropHold(h.Run, h.Target, h.Head); err != nil || !ok {
			continue
		}
		m.serving.end(h.Target, h.Run)
		m.cfg.Log.Warn("post-copy: a hold expired: its target read none of its objects for its life, nor said it holds the run; its objects are served no more", "run", h.Run, "to", h.Target, "since", h.Since, "life", HoldLife)
	}
}

// FetchIdle is how long a post-copy target may read none of a held
// run's objects and still be fetching it: a stop, and a drain's end,
// wait for the holds being fetched only (WaitHolds).
const FetchIdle = 10 * time.Second

// WaitHolds waits until no run held here is being fetched by its
// post-copy target — the target read one of its objects, or the hold was
// made by a hand-over, within FetchIdle — or ctx ends; it returns every
// hold left, fetched or not. A hold whose target is gone, or is waiting
// to try again, is not waited for: it is served again once this host
// serves.
func (m *Member) WaitHolds(ctx context.Context) ([]store.Hold, error) {
	for {
		hs, err := m.cfg.Store.Holds()
		if err != nil {
			return hs, err
		}
		now := time.Now()
		if !slices.ContainsFunc(hs, func(h store.Hold) bool { return m.serving.fetching(h.Target, h.Run, now) }) {
			return hs, nil
		}
		select {
		case <-ctx.Done():
			return hs, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// holdFor keeps run id, handed to host to at head, for to until its Done
// when rec's last park has slabs (a post-copy target may owe them):
// durable before the hand-over. It returns whether it holds.
func (m *Member) holdFor(id string, to, head record.Address, rec *record.Record) (bool, error) {
	if !lastSlabbed(m.cfg.Store, rec) {
		return false, nil
	}
	return true, m.cfg.Store.AddHold(id, to, head)
}
