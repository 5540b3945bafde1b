package transfer

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// rehasher rehashes, on every processor, objects the store holds: in a
// [Stage], beside its transfers, those held for the run that the fetch
// does not read (plain ones: slabs, transcripts, receipts, journals),
// each that hashes to its address then [Fetched.Rehashed], which the
// import does not read again; in [RehashHeld], ahead of the fetch. One
// that does not, is not reached before the Stage ends, or was rehashed
// RehashedFor ago or more when the import asks, is left to
// bundle.ImportStored, which rehashes it and refuses it (object_corrupt)
// as before: a damaged copy held here is refused while the source still
// holds the run.
type rehasher struct {
	st     *store.Store
	before func(record.Address) (time.Time, bool) // rehashed already (Options.Rehashed)
	ctx    context.Context
	cancel context.CancelFunc
	next   chan record.Address
	wg     sync.WaitGroup
	mu     sync.Mutex
	ok     map[record.Address]time.Time // when each was found to hash to its address
}

// RehashedFor is how long an object rehashed to its address stands as
// verified: one rehashed longer ago when the import asks
// ([Fetched.Rehashed]) is read again there.
const RehashedFor = 2 * time.Minute

// queued is how many held objects may wait for a worker before the walk
// that finds them waits too.
const queued = 1 << 14

func newRehasher(ctx context.Context, st *store.Store, before func(record.Address) (time.Time, bool)) *rehasher {
	ctx, cancel := context.WithCancel(ctx)
	r := &rehasher{st: st, before: before, ctx: ctx, cancel: cancel, next: make(chan record.Address, queued), ok: map[record.Address]time.Time{}}
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
		at := time.Now()
		if r.st.Verify(r.ctx, a) == nil {
			r.mu.Lock()
			r.ok[a] = at
			r.mu.Unlock()
		}
	}
}

// add queues held object a, unless it was rehashed before.
func (r *rehasher) add(a record.Address) {
	if r.before != nil {
		if at, ok := r.before(a); ok && time.Since(at) < RehashedFor {
			r.mu.Lock()
			r.ok[a] = at
			r.mu.Unlock()
			return
		}
	}
	select {
	case r.next <- a:
	case <-r.ctx.Done():
	}
}

// wait lets the workers finish what is queued and returns the objects
// that rehashed to their addresses, with when; a stopped rehasher's are
// not all.
func (r *rehasher) wait() map[record.Address]time.Time {
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

// RehashHeld rehashes, on every processor, each object the record of
// genesis held in st reaches, ahead of a migration that may bring the run
// back here (the source's expectation, POST /v1/migrations/expect), and
// returns those that hash to their addresses, with when: [Options.Rehashed]
// for the fetch. A store holding no record of genesis gives none.
func RehashHeld(ctx context.Context, st *store.Store, genesis record.Address) (map[record.Address]time.Time, error) {
	run, ok, err := st.RunOfGenesis(genesis)
	if err != nil || !ok {
		return nil, err
	}
	rec, err := st.Record(run)
	if err != nil {
		return nil, err
	}
	objs, err := bundle.Reached(st, rec, true)
	if err != nil {
		return nil, err
	}
	r := newRehasher(ctx, st, nil)
	for _, a := range objs {
		r.add(a)
	}
	held := r.wait()
	return held, ctx.Err()
}
