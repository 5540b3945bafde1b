// Package drain moves every run off a host (docs/fleet.md, "Drain"): which
// runs go first, to which host each goes, how many move at once, and what
// each run's outcome is; and this host's side of a placement ([Local]: its
// offer, a run's need, whether a received run fits). The moving itself — a
// migration — is the caller's, and so is asking other hosts for their
// offers; this package never imports the daemon.
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
	// Bytes is what the run costs the store that takes it: its parked
	// snapshot, or the memory of an executing image unit (its park's
	// image).
	Bytes uint64
}

// Target is a host a drain may move runs to, as it answered before the
// drain began (placement).
type Target struct {
	Key record.Address
	// Free is what its store can still take, beyond the room it keeps.
	Free uint64
	// Refuses holds the runs it cannot take and why: its manifest does
	// not match the run's recorded keys (an image run needs the image's
	// digest there).
	Refuses map[string]error
	// Err is why it did not answer: it is offered nothing.
	Err error
	// PostCopy is its offer's: it takes parked runs post-copy.
	PostCopy bool
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

// Options are how a drain moves its runs.
type Options struct {
	Parallel int     // how many runs move at once (at least 1)
	Migrate  Migrate // moves one run to one host
	// Progress, when not nil, is told each outcome as it ends, with how
	// many have ended of how many.
	Progress func(o Outcome, done, total int)
}

// Drain moves runs to hosts, opt.Parallel at a time: transcript runs
// first; each to the host whose manifest matches the run and that has the
// most room left once what this drain already sent it is counted
// (placement), passed on to the next such host when one refuses it at the
// migration. The outcomes are in the order moved.
func Drain(ctx context.Context, runs []Run, hosts []Target, opt Options) []Outcome {
	migrate, progress := opt.Migrate, opt.Progress
	ordered := order(runs)
	p := newPlacement(hosts)
	out := make([]Outcome, len(ordered))
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for range max(opt.Parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				t0 := time.Now()
				out[i] = p.move(ctx, ordered[i], migrate)
				out[i].Took = time.Since(t0)
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
func order(runs []Run) []Run {
	var first, then []Run
	for _, r := range runs {
		if r.Transcript {
			first = append(first, r)
		} else {
			then = append(then, r)
		}
	}
	return append(first, then...)
}

// move places run on the host with the most room left that can take it,
// moves it there, and on a refusal tries the next, until one takes it or
// none is left.
func (p *placement) move(ctx context.Context, run Run, migrate Migrate) Outcome {
	var errs []error
	tried := map[record.Address]bool{}
	for ctx.Err() == nil {
		h, why := p.reserve(run, tried)
		if h < 0 {
			errs = append(errs, why...)
			break
		}
		key := p.hosts[h].Key
		tried[key] = true
		err := migrate(ctx, run.ID, key)
		if err == nil {
			return Outcome{Run: run.ID, To: key}
		}
		p.release(h, run.Bytes)
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		errs = append(errs, ctx.Err())
	}
	return Outcome{Run: run.ID, Err: errors.Join(errs...)}
}
