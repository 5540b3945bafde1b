// Package drain moves every run off a host (docs/fleet.md, "Drain"): which
// runs go first, to which host each is offered, how many move at once,
// and what each run's outcome is. The moving itself — a migration — is
// the caller's; this package never imports the daemon.
package drain

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Run is a run the host holds, to be moved.
type Run struct {
	ID         string
	Transcript bool // a transcript run moves no image: it goes first
}

// Outcome is one run's end in a drain: the host it moved to, or why no
// host took it (every host's refusal, joined).
type Outcome struct {
	Run  string
	To   record.Address // zero when it did not move
	Err  error
	Took time.Duration // from the first offer to the outcome
}

// Migrate moves run id to host to.
type Migrate func(ctx context.Context, id string, to record.Address) error

// Drain moves runs to hosts, parallel at a time: transcript runs first;
// each offered to the hosts in turn, starting at a different one for each
// run so that runs spread, and passed on to the next when a host refuses
// it. progress, when not nil, is told each outcome as it ends, with how
// many have ended of how many. The outcomes are in the order moved.
func Drain(ctx context.Context, runs []Run, hosts []record.Address, parallel int, migrate Migrate, progress func(o Outcome, done, total int)) []Outcome {
	ordered := order(runs)
	out := make([]Outcome, len(ordered))
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for range max(parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				out[i] = place(ctx, ordered[i], hosts, i, migrate)
				mu.Lock()
				done++
				if progress != nil {
					progress(out[i], done, len(ordered))
				}
				mu.Unlock()
			}
		}()
	}
	for i := range ordered {
		work <- i
	}
	close(work)
	wg.Wait()
	return out
}

// order puts transcript runs first, each kind in the order given.
func order(runs []Run) []string {
	var first, then []string
	for _, r := range runs {
		if r.Transcript {
			first = append(first, r.ID)
		} else {
			then = append(then, r.ID)
		}
	}
	return append(first, then...)
}

// place offers run id to hosts in turn from the k-th, until one takes it.
func place(ctx context.Context, id string, hosts []record.Address, k int, migrate Migrate) Outcome {
	t0 := time.Now()
	o := offer(ctx, id, hosts, k, migrate)
	o.Took = time.Since(t0)
	return o
}

func offer(ctx context.Context, id string, hosts []record.Address, k int, migrate Migrate) Outcome {
	if len(hosts) == 0 {
		return Outcome{Run: id, Err: errors.New("no host to move it to")}
	}
	var errs []error
	for j := range hosts {
		host := hosts[(k+j)%len(hosts)]
		err := migrate(ctx, id, host)
		if err == nil {
			return Outcome{Run: id, To: host}
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return Outcome{Run: id, Err: errors.Join(errs...)}
}
