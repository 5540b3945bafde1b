package store

import (
	"context"
	"runtime"
	"sync"
)

// parallel runs fn(0) … fn(n-1) on one worker per processor and returns
// the first error; after an error no new calls start.
func parallel(ctx context.Context, n int, fn func(i int) error) error {
	return parallelN(ctx, n, 0, fn)
}

// parallelN is [parallel] on workers workers, or one per processor if
// that is more: for work that waits on the disk (an fsync), not on a
// processor.
func parallelN(ctx context.Context, n, workers int, fn func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(max(workers, runtime.GOMAXPROCS(0)), n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}
