package pageserver

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
)

// Reading ahead: lazy-pages asks for one range of a task at a time and
// waits for it, and its background transfer goes up in address, so after
// a background request (more than one page) the server reads and verifies
// the chunks that follow on a few workers while lazy-pages copies. Read on
// the request path, one file after another from a cold page cache, a
// large unit's chunks arrive slowly (docs/benchmarks.md).
const (
	// aheadBytes bounds the chunks read ahead and not yet served, shared
	// evenly by the tasks with verified extents: the chunks of a task
	// that has exited are never asked for, and hold only its share.
	aheadBytes = 32 << 20
	// aheadWorkers read and hash them, one chunk at a time, where the
	// kernel has no AIO; where it has, aioReaders do, a batch at a time
	// (aio.go).
	aheadWorkers = 16
)

// aioReaders is one per processor, and at least two, so that one opens
// and hashes while another's reads are out.
var aioReaders = max(2, min(runtime.GOMAXPROCS(0), aheadWorkers))

// ahead is the chunks read and verified ahead of their request.
type ahead struct {
	jobs     chan *slot
	wg       sync.WaitGroup
	canceled atomic.Bool // the serve failed: queued reads are not done
	dirs     dirs        // the chunk files' directories, open
	// fetch asks the daemon for owed extents (nil: none is owed); set
	// before the serve begins.
	fetch *fetcher
	// Owned by the serving goroutine:
	slots map[*Extent]*slot
	bytes map[*Task]uint64 // read ahead and not served, per task
	share uint64           // each task's bound
	// cursor is, per task, the extent the last read-ahead stopped at:
	// the next one starts there, not again at every extent it passed.
	cursor map[*Task]int
}

// slot is one chunk read ahead: b or err once done is closed.
type slot struct {
	t    *Task
	e    *Extent
	done chan struct{}
	b    []byte
	err  error
}

// errCanceled is a read ahead not done: the serve had failed.
var errCanceled = errors.New("pageserver: read ahead canceled")

func newAhead(m *Table) *ahead {
	a := &ahead{jobs: make(chan *slot, aheadBytes/PageSize), slots: map[*Extent]*slot{}, bytes: map[*Task]uint64{},
		cursor: map[*Task]int{}, share: aheadBytes}
	if n := verifiedTasks(m); n > 1 {
		a.share = aheadBytes / uint64(n)
	}
	workers, readers := aheadWorkers, []*aio(nil)
	for range aioReaders {
		r, err := newAIO()
		if err != nil {
			break // reads past the cache one at a time, on more workers
		}
		readers = append(readers, r)
	}
	if len(readers) == aioReaders {
		workers = aioReaders
	} else {
		for _, r := range readers {
			r.close()
		}
		readers = nil
	}
	for i := range workers {
		var r *aio
		if readers != nil {
			r = readers[i]
		}
		a.wg.Add(1)
		go a.work(r)
	}
	return a
}

// work loads the chunks queued, in batches of up to aioBatch taken as
// they are queued when r is not nil, else one by one.
func (a *ahead) work(r *aio) {
	defer a.wg.Done()
	if r != nil {
		defer r.close()
	}
	batch := make([]*slot, 0, aioBatch)
	for sl := range a.jobs {
		batch = append(batch[:0], sl)
		for more := r != nil; more && len(batch) < aioBatch; {
			select {
			case sl, ok := <-a.jobs:
				if more = ok; ok {
					batch = append(batch, sl)
				}
			default:
				more = false
			}
		}
		if !a.canceled.Load() {
			batch = a.fetched(batch)
		}
		switch {
		case len(batch) == 0:
		case a.canceled.Load():
			for _, sl := range batch {
				sl.err = errCanceled
				close(sl.done)
			}
		case r != nil:
			loadChunks(batch, &a.dirs, r) // closes each done
		default:
			sl.b, sl.err = loadChunk(sl.e, &a.dirs) // fetched above
			close(sl.done)
		}
	}
}

// fetched has the daemon fetch the owed chunks of batch, all asked at
// once, and returns the slots to load: a slot whose chunk was not fetched
// is done, with the refusal.
func (a *ahead) fetched(batch []*slot) []*slot {
	if a.fetch == nil {
		return batch
	}
	asked := make([]*fetching, len(batch))
	for i, sl := range batch {
		if sl.e.Owed {
			asked[i] = a.fetch.ask(sl.e)
		}
	}
	out := batch[:0]
	for i, sl := range batch {
		if asked[i] != nil {
			if err := asked[i].wait(); err != nil {
				sl.err = err
				close(sl.done)
				continue
			}
		}
		out = append(out, sl)
	}
	return out
}

// load is loadChunk, once the daemon fetched e if it is owed.
func (a *ahead) load(e *Extent) ([]byte, error) {
	if err := a.fetch.fetched(e); err != nil {
		return nil, err
	}
	return loadChunk(e, &a.dirs)
}

// verifiedTasks is how many tasks of m have a verified extent.
func verifiedTasks(m *Table) int {
	n := 0
	for _, t := range m.Tasks {
		for _, e := range t.Extents {
			if e.Verify != nil {
				n++
				break
			}
		}
	}
	return n
}

// take is verified extent e's bytes: read ahead, or read now.
func (a *ahead) take(e *Extent) ([]byte, error) {
	sl := a.slots[e]
	if sl == nil {
		return a.load(e)
	}
	<-sl.done
	delete(a.slots, e)
	a.bytes[sl.t] -= e.Size
	return sl.b, sl.err
}

// after queues the verified chunks of t from extent next on, up to t's
// share of aheadBytes not yet served. Chunks below next that were read
// ahead and passed over (lazy-pages dropped their range: the unit
// unmapped it) are let go first.
func (a *ahead) after(t *Task, next int, verified map[*Extent]bool) {
	if a.bytes[t] >= a.share && next < len(t.Extents) {
		for e, sl := range a.slots {
			if sl.t == t && e.Vaddr < t.Extents[next].Vaddr {
				<-sl.done
				delete(a.slots, e)
				a.bytes[t] -= e.Size
				if sl.err == nil {
					putBuf(sl.b)
				}
			}
		}
	}
	k := max(next, a.cursor[t])
	for ; k < len(t.Extents) && a.bytes[t] < a.share; k++ {
		e := &t.Extents[k]
		if e.Verify == nil || verified[e] || a.slots[e] != nil {
			continue
		}
		sl := &slot{t: t, e: e, done: make(chan struct{})}
		a.slots[e] = sl
		a.bytes[t] += e.Size
		a.jobs <- sl
	}
	a.cursor[t] = k
}

// stop ends the workers once the queued reads are done, or, when the
// serve failed (cancel), once those begun are.
func (a *ahead) stop(cancel bool) {
	a.canceled.Store(cancel)
	close(a.jobs)
	a.wg.Wait()
	a.dirs.close()
}
