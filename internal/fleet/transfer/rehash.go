package transfer

import (
	"context"
	"runtime"
	"sync"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// rehasher rehashes, alongside a [Stage]'s transfers and on every
// processor, the objects the store held for the run that the fetch does
// not read (plain ones: slabs, transcripts, receipts, journals): each
// that hashes to its address is [Fetched.Rehashed], and the import does
// not read it again. One that does not, or is not reached before the
// Stage ends, is left to bundle.ImportStored, which rehashes it and
// refuses it (object_corrupt) as before: a damaged copy held here is
// refused while the source still holds the run.
type rehasher struct {
	st     *store.Store
	ctx    context.Context
	cancel context.CancelFunc
	next   chan record.Address
	wg     sync.WaitGroup
	mu     sync.Mutex
	ok     map[record.Address]bool
}

// queued is how many held objects may wait for a worker before the walk
// that finds them waits too.
const queued = 1 << 14

func newRehasher(ctx context.Context, st *store.Store) *rehasher {
	ctx, cancel := context.WithCancel(ctx)
	r := &rehasher{st: st, ctx: ctx, cancel: cancel, next: make(chan record.Address, queued), ok: map[record.Address]bool{}}
	for range runtime.GOMAXPROCS(0) {
		r.wg.Go(r.work)
	}
	return r
}

func (r *rehasher) work() {
	for a := range r.next {
		if r.ctx.Err() != nil {
			continue
		}
		if r.st.Verify(r.ctx, a) == nil {
			r.mu.Lock()
			r.ok[a] = true
			r.mu.Unlock()
		}
	}
}

// add queues held object a.
func (r *rehasher) add(a record.Address) {
	select {
	case r.next <- a:
	case <-r.ctx.Done():
	}
}

// wait lets the workers finish what is queued and returns the objects
// that rehashed to their addresses; a stopped rehasher's are not all.
func (r *rehasher) wait() map[record.Address]bool {
	close(r.next)
	r.wg.Wait()
	r.cancel()
	return r.ok
}

// stop abandons what is queued and waits for the workers.
func (r *rehasher) stop() {
	r.cancel()
	r.wait()
}
