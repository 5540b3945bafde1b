package pageserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Owed extents: a post-copy migration's target restores a unit before it
// holds every chunk (docs/fleet.md, "Post-copy"). An owed extent's file is
// filled while the unit runs; before the page server first reads one, it
// asks the daemon, over a socket of its own (the process's fd 5), to
// fetch it ([Table.Fetch]), and waits for the answer. The chunk is then
// read and hashed as any other: the daemon verified it against the
// chunk's index record before it wrote it, and the server verifies it
// again before any of its pages goes.
//
// A request is 8 bytes: u32 task and u32 extent, the extent's place in
// the table; the answer repeats them and adds one byte: 0 fetched, 1 not.
// Integers are big-endian.
const (
	fetchRequest = 8
	fetchAnswer  = 9
)

// ErrNotFetched is an owed extent the daemon did not fetch (its source
// refused it, could not be reached, or the daemon is gone): none of its
// pages is served.
var ErrNotFetched = errors.New("pageserver: an owed chunk was not fetched")

// owes says whether some extent of m is owed.
func (m *Table) owes() bool {
	for _, t := range m.Tasks {
		for _, e := range t.Extents {
			if e.Owed {
				return true
			}
		}
	}
	return false
}

// fetcher is the page server's side: each owed extent asked once.
type fetcher struct {
	w   io.Writer
	ids map[*Extent][2]uint32
	at  map[[2]uint32]*Extent

	mu    sync.Mutex
	asked map[*Extent]*fetching
	err   error // the socket's end: every fetch not answered fails
}

// fetching is one owed extent asked: err once done is closed.
type fetching struct {
	done chan struct{}
	err  error
}

// newFetcher asks m's owed extents of the daemon on rw, reading its
// answers until rw ends.
func newFetcher(m *Table, rw io.ReadWriter) *fetcher {
	f := &fetcher{w: rw, ids: map[*Extent][2]uint32{}, at: map[[2]uint32]*Extent{}, asked: map[*Extent]*fetching{}}
	for i := range m.Tasks {
		for j := range m.Tasks[i].Extents {
			if e := &m.Tasks[i].Extents[j]; e.Owed {
				id := [2]uint32{uint32(i), uint32(j)}
				f.ids[e], f.at[id] = id, e
			}
		}
	}
	go f.answers(rw)
	return f
}

// ask asks for owed extent e unless it was asked already; wait for the
// answer with [fetching.wait].
func (f *fetcher) ask(e *Extent) *fetching {
	f.mu.Lock()
	defer f.mu.Unlock()
	if x := f.asked[e]; x != nil {
		return x
	}
	x := &fetching{done: make(chan struct{})}
	f.asked[e] = x
	if f.err != nil {
		x.err = f.err
		close(x.done)
		return x
	}
	id := f.ids[e]
	var b [fetchRequest]byte
	binary.BigEndian.PutUint32(b[0:], id[0])
	binary.BigEndian.PutUint32(b[4:], id[1])
	if _, err := f.w.Write(b[:]); err != nil {
		f.endLocked(fmt.Errorf("%w: asking the daemon: %w", ErrNotFetched, err))
	}
	return x
}

// wait is the answer to the fetch.
func (x *fetching) wait() error {
	<-x.done
	return x.err
}

// fetched makes sure owed extent e is fetched: nil at once for an extent
// not owed.
func (f *fetcher) fetched(e *Extent) error {
	if f == nil || !e.Owed {
		return nil
	}
	return f.ask(e).wait()
}

// answers reads the daemon's answers until r ends, then fails every
// fetch not answered.
func (f *fetcher) answers(r io.Reader) {
	var b [fetchAnswer]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			f.end(fmt.Errorf("%w: the daemon hung up (%w)", ErrNotFetched, err))
			return
		}
		id := [2]uint32{binary.BigEndian.Uint32(b[0:]), binary.BigEndian.Uint32(b[4:])}
		f.mu.Lock()
		e := f.at[id]
		x := f.asked[e]
		if e == nil || x == nil || b[8] > 1 {
			f.endLocked(fmt.Errorf("%w: an answer to no request (%d, %d, %d)", ErrNotFetched, id[0], id[1], b[8]))
			f.mu.Unlock()
			return
		}
		select {
		case <-x.done: // answered twice: the first answer stands
		default:
			if b[8] != 0 {
				x.err = fmt.Errorf("%w: the chunk at %#x", ErrNotFetched, e.Vaddr)
			}
			close(x.done)
		}
		f.mu.Unlock()
	}
}

func (f *fetcher) end(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endLocked(err)
}

func (f *fetcher) endLocked(err error) {
	if f.err == nil {
		f.err = err
	}
	for _, x := range f.asked {
		select {
		case <-x.done:
		default:
			x.err = f.err
			close(x.done)
		}
	}
}

// serveFetches is the daemon's side: it answers the page server's
// requests on rw, each by m.Fetch on its own goroutine, until rw ends or
// ctx does. A request naming no owed extent ends it.
func serveFetches(ctx context.Context, m *Table, rw io.ReadWriter) {
	var mu sync.Mutex // one answer written at a time
	var wg sync.WaitGroup
	defer wg.Wait()
	var b [fetchRequest]byte
	for {
		if _, err := io.ReadFull(rw, b[:]); err != nil {
			return
		}
		i, j := binary.BigEndian.Uint32(b[0:]), binary.BigEndian.Uint32(b[4:])
		if int(i) >= len(m.Tasks) || int(j) >= len(m.Tasks[i].Extents) || !m.Tasks[i].Extents[j].Owed {
			return // not this table's server: its next asks fail
		}
		e, req := m.Tasks[i].Extents[j], b
		wg.Go(func() {
			var a [fetchAnswer]byte
			copy(a[:], req[:])
			if err := m.Fetch(ctx, e); err != nil {
				a[8] = 1
			}
			mu.Lock()
			defer mu.Unlock()
			_, _ = rw.Write(a[:])
		})
	}
}
