package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Writers queue their transaction functions; one goroutine
// takes whatever is queued — never waiting for more — and commits it in
// one bbolt transaction, so one fsync serves every writer that arrived
// while the previous commit was in flight. A lone writer commits at once.
// When any function in a batch returns an error, the whole transaction is
// rolled back and each function is run again in a transaction of its own,
// so a refusal can never commit a partial write or disturb another writer.

const maxBatch = 256

type commitReq struct {
	fn  func(tx *bolt.Tx) error
	err chan error
}

func (s *Store) commit(fn func(tx *bolt.Tx) error) error {
	req := &commitReq{fn: fn, err: make(chan error, 1)}
	s.queue <- req
	return <-req.err
}

func (s *Store) commitLoop() {
	defer close(s.done)
	batch := make([]*commitReq, 0, maxBatch)
	for req := range s.queue {
		batch = append(batch[:0], req)
	drain:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-s.queue:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		s.run(batch)
	}
}

func (s *Store) run(batch []*commitReq) {
	errs := make([]error, len(batch))
	err := s.update(func(tx *bolt.Tx) error {
		for i, r := range batch {
			if errs[i] = r.fn(tx); errs[i] != nil {
				return errs[i] // roll back the batch
			}
		}
		return nil
	})
	if err != nil && len(batch) > 1 {
		for _, r := range batch {
			var e error
			if cerr := s.update(func(tx *bolt.Tx) error { e = r.fn(tx); return e }); cerr != nil && e == nil {
				e = cerr
			}
			r.err <- e
		}
		return
	}
	for i, r := range batch {
		if err != nil {
			r.err <- err
		} else {
			r.err <- errs[i]
		}
	}
}

func (s *Store) update(fn func(tx *bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("store: %w: %v", ErrDamaged, r)
		}
	}()
	return s.db.Update(fn)
}
