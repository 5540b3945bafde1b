package member

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A lazy resume of a run still owing slabs (docs/fleet.md, "Post-copy"):
// instead of waiting for every slab (Pay), the resume borrows the files
// they are filled in (Lend): the restore's page server has each chunk it
// serves fetched first, the one a fault waits for ahead of the background
// fetch, which goes on filling, adopting and settling each slab.

// owedSet is one run's owed slabs being filled, shared by the background
// fetch (fill) and the lazy resumes lent them, from one source; it is
// closed, and what it filled and did not adopt removed, once none of them
// holds it.
type owedSet struct {
	src  transfer.Source
	done func() // lets src go
	// reads bounds the lent fetches under way at once: a page server
	// reading ahead asks for thousands of chunks, and the source's peer
	// listener holds few connections from one host.
	reads chan struct{}

	mu    sync.Mutex
	slabs map[record.Address]*transfer.Owed
	// retired are slabs whose source sent wrong bytes, replaced in slabs
	// (slab): a lazy restore lent one may still read its written chunks.
	retired []*transfer.Owed
	// refs, under payers.mu, counts the holders.
	refs int
}

// owedSet is run id's set (p is its payer, held by the caller), made,
// reading from source, if it has none; release it.
func (m *Member) owedSet(p *payer, source record.Address) (*owedSet, func(), error) {
	pp := &m.paying
	pp.mu.Lock()
	s := p.set
	if s != nil {
		s.refs++
	}
	pp.mu.Unlock()
	if s == nil {
		src, done, err := m.cfg.Peers.Source(pp.ctx, source)
		if err != nil {
			return nil, nil, err
		}
		pp.mu.Lock()
		if s = p.set; s != nil { // made meanwhile
			s.refs++
			pp.mu.Unlock()
			done()
		} else {
			s = &owedSet{src: src, done: done, reads: make(chan struct{}, lentReads), slabs: map[record.Address]*transfer.Owed{}, refs: 1}
			p.set = s
			pp.mu.Unlock()
		}
	}
	var once sync.Once
	return s, func() { once.Do(func() { m.releaseSet(p, s) }) }, nil
}

// releaseSet lets set s of payer p go: the last holder closes it.
func (m *Member) releaseSet(p *payer, s *owedSet) {
	pp := &m.paying
	pp.mu.Lock()
	s.refs--
	last := s.refs == 0
	if last && p.set == s {
		p.set = nil
	}
	pp.mu.Unlock()
	if !last {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.slabs {
		o.Close()
	}
	for _, o := range s.retired {
		o.Close()
	}
	s.slabs, s.retired = nil, nil
	s.done()
}

// slab is the set's owed slab sl, made if it has none yet, or if the one
// it has was refused the source's bytes (transfer.Owed.Err): that one is
// retired, kept until the set is closed (a lazy restore lent it may read
// its written chunks), and the next try asks the source anew.
func (s *owedSet) slab(st *store.Store, sl transfer.OwedSlab) (*transfer.Owed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.slabs[sl.Slab.Address]; o != nil {
		if o.Err() == nil {
			return o, nil
		}
		s.retired = append(s.retired, o)
	}
	o, err := transfer.NewOwed(st, s.src, sl.Slab, sl.Chunks)
	if err != nil {
		return nil, err
	}
	s.slabs[sl.Slab.Address] = o
	return o, nil
}

// errNoChunk is a fetch of bytes the index lists as no chunk.
var errNoChunk = errors.New("the index lists no such chunk")

// Lent is a run's owed slabs lent to one lazy resume (park.Owed): the
// files they are filled in, and each chunk fetched on demand. Close it
// once the restore's page server is done with them.
type Lent struct {
	m     *Member
	id    string
	set   *owedSet
	slabs map[record.Address]*transfer.Owed // as lent: a slab retired later stays this loan's
	close func()
	// logged: a refused fetch was logged.
	logged atomic.Bool
}

// Lend lends run id's owed slabs to a lazy resume, and has the background
// fetch go on bringing them in: nil, with no error, when the run owes
// none. It is refused as Pay is: at once, with store.ErrStranded, for a
// stranded owing; store.ErrOwed when this host is not in a fleet.
func (m *Member) Lend(ctx context.Context, id string) (*Lent, error) {
	st := m.cfg.Store
	if err := st.Owes(id); err == nil || !errors.Is(err, store.ErrOwed) || errors.Is(err, store.ErrStranded) {
		return nil, err
	}
	o, ok, err := st.Owed(id)
	if err != nil || !ok {
		return nil, err
	}
	if err := m.moving("post-copy", id); err != nil {
		return nil, fmt.Errorf("%w: %w", store.ErrOwed, err)
	}
	slabs, err := owedSlabs(st, o)
	if err != nil {
		return nil, err
	}
	p, releasePayer := m.paying.acquire(id)
	set, releaseSet, err := m.owedSet(p, o.Source)
	if err != nil {
		releasePayer()
		return nil, fmt.Errorf("%w: %w", store.ErrOwed, err)
	}
	var once sync.Once
	l := &Lent{m: m, id: id, set: set, slabs: map[record.Address]*transfer.Owed{}, close: func() { once.Do(func() { releaseSet(); releasePayer() }) }}
	for _, s := range slabs {
		if st.Has(s.Slab.Address) {
			continue
		}
		o, err := set.slab(st, s)
		if err != nil {
			l.Close()
			return nil, err
		}
		l.slabs[s.Slab.Address] = o
	}
	// The background fetch fills the rest, now.
	if m.payLater(id) {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return l, nil
}

// Path is the file owed slab is filled in, if it is lent.
func (l *Lent) Path(slab record.Address) (string, bool) {
	o := l.slabs[slab]
	if o == nil {
		return "", false
	}
	return o.Path(), true
}

// Bytes is the size of the lent slabs together.
func (l *Lent) Bytes() uint64 {
	var n uint64
	for _, o := range l.slabs {
		n += o.Size()
	}
	return n
}

// Lent fetches: at most lentReads at once, each chunk read with the
// chunks after it (transfer.Owed.ChunkAhead) and tried lentTries times
// while the link fails it at once (not the source's bytes, not a read
// that timed out: a stalled source is given up on after one).
const (
	lentReads = 4
	lentTries = 3
)

// Fetch returns nil once the chunk of slab at offset, of size bytes, is
// in slab's file, verified against its index record: fetched now, with
// the chunks that follow it, unless it was already. A refusal wraps
// store.ErrOwed, and is logged.
func (l *Lent) Fetch(ctx context.Context, slab record.Address, offset, size uint64) error {
	err := l.fetch(ctx, slab, offset, size)
	if err != nil && ctx.Err() == nil {
		if l.logged.CompareAndSwap(false, true) { // the first: read-ahead asks many at once
			l.m.cfg.Log.Warn("post-copy: a chunk the lazy restore needs is not fetched", "run", l.id, "slab", slab, "offset", offset, "err", err)
		}
		err = fmt.Errorf("post-copy: %w: %w", store.ErrOwed, err)
	}
	return err
}

func (l *Lent) fetch(ctx context.Context, slab record.Address, offset, size uint64) error {
	o := l.slabs[slab]
	if o == nil {
		return fmt.Errorf("slab %s is not lent", slab)
	}
	i, ok := o.Find(offset, size)
	if !ok {
		return fmt.Errorf("%w: slab %s, %d bytes at %d", errNoChunk, slab, size, offset)
	}
	var err error
	for try := range lentTries {
		if try > 0 {
			select {
			case <-time.After(time.Duration(try) * 100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case l.set.reads <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		err = o.ChunkAhead(ctx, i)
		<-l.set.reads
		if err == nil || errors.Is(err, transfer.ErrMismatch) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// Close ends the loan (again: nothing).
func (l *Lent) Close() {
	if l != nil {
		l.close()
	}
}
