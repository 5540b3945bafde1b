package store

import (
	"time"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Writers queue their transaction functions; one goroutine
// takes what is queued and commits it in one bbolt transaction, so one pair
// of fsyncs serves every writer that arrived while the previous commit was
// in flight. A lone writer is committed at once.
//
// A function refuses (a stale head, a missing run) by returning
// [refuse]'s error before it writes anything; the batch goes on without it.
// Any other error may follow a partial write, so the whole transaction is
// rolled back and each function is run again in a transaction of its own:
// one writer's failure never commits half of it, and never costs another
// writer its append.
//
// bbolt's own DB.Batch waits up to MaxBatchDelay (10 ms) for company before
// it commits, which caps a lone writer at about 100 commits a second, and
// re-runs a refusing function alone at the cost of another commit.

const (
	maxBatch = 512
	// A committer expecting company waits for the next writer at most
	// gatherIdle, and for the whole batch at most gatherMax: both small
	// beside a commit's two fsyncs.
	gatherIdle = 50 * time.Microsecond
	gatherMax  = 500 * time.Microsecond
)

type commitReq struct {
	fn  func(tx *bolt.Tx) error
	err chan error
}

// refusal marks an error returned by a commit function before it wrote.
type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() }

// refuse returns err marked as a refusal: the function returning it has
// written nothing in the transaction.
func refuse(err error) error { return &refusal{err} }

// commit runs fn in a durable write transaction shared with concurrent
// writers, and returns fn's error or the commit's.
func (s *Store) commit(fn func(tx *bolt.Tx) error) error {
	req := &commitReq{fn: fn, err: make(chan error, 1)}
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return ErrClosed
	}
	s.queue <- req
	s.closeMu.RUnlock()
	return <-req.err
}

func (s *Store) commitLoop() {
	defer close(s.done)
	batch := make([]*commitReq, 0, maxBatch)
	idle := time.NewTimer(time.Hour)
	last := 1
	for req := range s.queue {
		batch = s.gather(append(batch[:0], req), last, idle)
		last = len(batch)
		s.run(batch)
		clear(batch)
	}
}

// gather adds queued requests to batch. When the last batch had company,
// its writers are likely on their way back with their next append: wait
// for them until as many are here as last time, or none arrives for
// gatherIdle, or gatherMax has passed. A lone writer never waits.
func (s *Store) gather(batch []*commitReq, last int, idle *time.Timer) []*commitReq {
	start := time.Now()
	for len(batch) < maxBatch {
		select {
		case r, ok := <-s.queue:
			if !ok {
				return batch
			}
			batch = append(batch, r)
			continue
		default:
		}
		if len(batch) >= last || time.Since(start) > gatherMax {
			return batch
		}
		idle.Reset(gatherIdle)
		select {
		case r, ok := <-s.queue:
			idle.Stop()
			if !ok {
				return batch
			}
			batch = append(batch, r)
		case <-idle.C:
			return batch
		}
	}
	return batch
}

func (s *Store) run(batch []*commitReq) {
	errs := make([]error, len(batch))
	err := s.update(func(tx *bolt.Tx) error {
		for i, r := range batch {
			if errs[i] = r.fn(tx); errs[i] != nil {
				if _, refused := errs[i].(*refusal); !refused {
					return errs[i]
				}
			}
		}
		return nil
	})
	if err != nil && len(batch) > 1 {
		// Something failed after writing: nothing of the batch is committed.
		// Run each alone so only the failing one fails.
		for _, r := range batch {
			var e error
			cerr := s.update(func(tx *bolt.Tx) error { e = r.fn(tx); return e })
			if e == nil {
				e = cerr
			}
			r.err <- unmark(e)
		}
		return
	}
	for i, r := range batch {
		if err != nil {
			r.err <- unmark(err)
		} else {
			r.err <- unmark(errs[i])
		}
	}
}

func unmark(err error) error {
	if r, ok := err.(*refusal); ok {
		return r.err
	}
	return err
}
