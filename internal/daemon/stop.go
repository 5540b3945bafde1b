package daemon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Stop and start (docs/daemon.md, "Stop and start"): every executing run
// parked in its form before the daemon stops — an image run through
// CRIU, a transcript run through its channel with the interval's call
// account, so its wait proof stays proved — each listed with the head its
// park left (comebacklist.go); at the next start, after reconcile and
// the image-park probe, each listed run still parked at that head, still
// this host's, is resumed.

// DefaultParkAllParallel is how many runs `park --all` and the stop park
// at once, and the start resumes at once.
const DefaultParkAllParallel = 4

// ParkAll parks every run executing on this host, parallel at a time, and
// lists each for the next start to resume; the outcome is in run id order. A run it cannot park goes on
// executing, and its outcome says why. Runs another host of the fleet
// owns, and runs that stop executing meanwhile, are not in the outcome.
func (d *Daemon) ParkAll(ctx context.Context, parallel int) ([]answers.Each[answers.Parked], error) {
	ids, err := d.st.Runs(record.PhaseExecuting)
	if err != nil {
		return nil, err
	}
	if parallel < 1 {
		parallel = DefaultParkAllParallel
	}
	var (
		mu  sync.Mutex
		out []answers.Each[answers.Parked]
		wg  sync.WaitGroup
	)
	sem := make(chan struct{}, parallel)
	for _, id := range ids {
		if d.fleet.Elsewhere(id) != nil {
			continue // not this host's: reconcile left it no sandbox here
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			e, ok := d.parkListed(ctx, id)
			if ok {
				mu.Lock()
				out = append(out, e)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b answers.Each[answers.Parked]) int { return strings.Compare(a.Run, b.Run) })
	return out, nil
}

// ParkForStop is ParkAll for the daemon's stop: from now on no run starts
// or resumes here (answers.ErrStopping), and a transcript run's park makes it no
// warm sandbox.
func (d *Daemon) ParkForStop(ctx context.Context, parallel int) ([]answers.Each[answers.Parked], error) {
	d.stopping.Store(true)
	return d.ParkAll(ctx, parallel)
}

// parkListed parks run id if it is executing, and lists it; ok is false
// when it was not executing once its lock was held.
func (d *Daemon) parkListed(ctx context.Context, id string) (answers.Each[answers.Parked], bool) {
	e := answers.Each[answers.Parked]{Run: id}
	r, err := d.runs.lockRun(id)
	if err != nil {
		e.Err = err
		return e, true
	}
	defer r.mu.Unlock()
	if st, err := d.st.Run(id); err != nil || st.Phase != record.PhaseExecuting {
		return e, false
	}
	p, err := d.park(ctx, id, r)
	if err != nil {
		e.Err = err
		d.log.Error("park all: the run goes on executing", "run", id, "err", err)
		return e, true
	}
	e.Answer = &p
	if e.Err = d.comebacks.AddHead(d.st, id); e.Err != nil {
		d.log.Error("stop", "run", id, "err", e.Err)
	}
	return e, true
}

// ComeBack waits for the image-park probe, then resumes, parallel at a
// time, each run a stop or `park --all` listed (comebacklist.go): a run
// still parked at the head its park left, not handed off, and in a fleet
// still this host's in the directory. A listed run that is gone, moved on
// since or another host's leaves the list, and is left as it is; one
// whose resume is refused stays parked and listed, for the next start (or
// a resume by hand) to take it.
func (d *Daemon) ComeBack(ctx context.Context, parallel int) []answers.Each[answers.Resumed] {
	// The start is done once the probe is: an image run's resume waits
	// for it anyway.
	_ = d.probe.Ready(ctx)
	list := d.comebacks
	entries, err := list.Entries()
	if err != nil {
		d.log.Error("start: the runs the last stop parked are not resumed; resume them by hand", "err", err)
		return nil
	}
	if len(entries) == 0 {
		return nil
	}
	if parallel < 1 {
		parallel = DefaultParkAllParallel
	}
	var (
		mu   sync.Mutex
		out  []answers.Each[answers.Resumed]
		done []string
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, parallel)
	for _, en := range entries {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			e, drop := d.comeBack(ctx, en)
			mu.Lock()
			defer mu.Unlock()
			if drop {
				done = append(done, en.Run)
			}
			if e.Answer != nil || e.Err != nil {
				out = append(out, e)
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b answers.Each[answers.Resumed]) int { return strings.Compare(a.Run, b.Run) })
	if err := list.Remove(done...); err != nil {
		d.log.Error("start: the runs resumed stay listed", "err", err)
	}
	return out
}

// comeBack resumes one listed run; drop says its entry is done with.
func (d *Daemon) comeBack(ctx context.Context, en comebackEntry) (e answers.Each[answers.Resumed], drop bool) {
	e.Run = en.Run
	r, err := d.runs.lockRun(en.Run)
	if errors.Is(err, store.ErrNoRun) {
		d.log.Warn("start: a run the last stop parked is gone", "run", en.Run)
		return e, true
	}
	if err != nil {
		e.Err = err
		return e, false
	}
	defer r.mu.Unlock()
	st, err := d.st.Run(en.Run)
	switch {
	case err != nil:
		e.Err = err
		return e, false
	case st.Phase != record.PhaseParked || st.Head != en.Head:
		d.log.Info("start: a run the last stop parked moved on since; left as it is", "run", en.Run, "phase", st.Phase)
		return e, true
	}
	if err := bundle.HeldHere(d.st, en.Run); err != nil {
		return e, true
	}
	if err := d.fleet.Elsewhere(en.Run); err != nil {
		d.log.Info("start: a run the last stop parked is another host's now; left to it", "run", en.Run, "err", err)
		return e, true
	}
	res, err := d.resume(ctx, en.Run, r, nil)
	if errors.Is(err, secrets.ErrRequired) {
		// Its values went with the host's tmpfs (a reboot): only a
		// resume that gives them again takes it back.
		e.Err = err
		d.log.Warn("start: a run the last stop parked needs its secrets again; it stays parked until a resume gives them", "run", en.Run, "err", err)
		return e, true
	}
	if err != nil {
		e.Err = err
		d.log.Error("start: a run the last stop parked is not resumed; it stays parked", "run", en.Run, "err", err)
		return e, false
	}
	e.Answer = &res
	return e, true
}
