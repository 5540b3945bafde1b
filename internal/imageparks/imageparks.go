// Package imageparks is the gate in front of every image park and image
// resume: whether this host can checkpoint and restore at all, as found by
// a probe (a throwaway process and a throwaway container, each dumped and
// restored under a deadline; internal/executor's Probe). `criu check` passing
// is not enough, so nothing image-mode goes ahead until a probe did.
//
// It owns the probe's lifecycle ([Start]: one probe in the background at
// start; [Gate.Ready]: wait for it, and probe again a minute after a
// failure; [Gate.Status]: what `runrecordd host` shows) and the deadline of
// CRIU's dumps and restores ([Deadline]). It never imports internal/daemon.
//
// Where to change what: how the probe itself works is internal/executor's
// probe.go; how its findings are set against the CRIU build's record is
// [CheckBuild]; when a failed probe is retried is [ReprobeAfter]; how long
// CRIU may take is [Deadline]; how the outcome is shown over the API is
// the daemon's Host. docs/daemon.md, "Image parks on this host: the
// probe", describes all of it to users.
package imageparks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// ErrUnavailable is an image-mode run, park or resume on a host where image
// parks are unavailable: the probe at start could not dump and restore
// (the message says why). Transcript runs are unaffected.
var ErrUnavailable = errors.New("image parks are unavailable on this host")

// Deadlines of CRIU's dumps and restores (docs/daemon.md): a base, plus a
// second for every 64 MiB of memory the operation moves.
const (
	baseDeadline = 30 * time.Second
	deadlineRate = 64 << 20 // bytes per second of deadline
)

// Deadline is the deadline of a dump or restore that moves memBytes of
// memory: cfg (the daemon's --criu-deadline) when set, derived from
// memBytes otherwise.
func Deadline(cfg time.Duration, memBytes uint64) time.Duration {
	if cfg > 0 {
		return cfg
	}
	return baseDeadline + time.Duration(memBytes/deadlineRate)*time.Second
}

// ReprobeAfter is how long after a failed probe a request that needs image
// parks probes again: a host whose CRIU is fixed gets them back without a
// restart, and a broken one is not probed on every request.
const ReprobeAfter = time.Minute

// Prober runs one probe; the caller bounds each of its steps.
type Prober func(ctx context.Context) criu.Probe

// Gate is the outcome of the latest probe, and the probe under way.
type Gate struct {
	bg      context.Context // done once the daemon stops: probes stop with it
	wg      *sync.WaitGroup // holds every probe goroutine
	probe   Prober
	criuErr error // CRIU did not tell its version at start: never probed
	log     *slog.Logger
	now     func() time.Time // the clock that times ReprobeAfter
	after   time.Duration    // ReprobeAfter; tests shorten it

	// slots admits the dumps and restores that run at once (Admit);
	// waiting counts those waiting for one, expected the restores soon to
	// ask (Expect).
	slots             chan struct{}
	waiting, expected atomic.Int64

	mu       sync.Mutex
	done     chan struct{} // closed once p is set
	p        criu.Probe
	finished time.Time
}

// Start probes in the background, under bg and counted in wg, whether this
// host can checkpoint and restore. A CRIU that did not tell its version
// (criuErr not nil) is not probed: the gate stays closed with criuErr as
// the reason, and is never probed again.
func Start(bg context.Context, wg *sync.WaitGroup, probe Prober, criuErr error, log *slog.Logger) *Gate {
	g := newGate(bg, wg, probe, criuErr, log)
	g.start()
	return g
}

func newGate(bg context.Context, wg *sync.WaitGroup, probe Prober, criuErr error, log *slog.Logger) *Gate {
	return &Gate{bg: bg, wg: wg, probe: probe, criuErr: criuErr, log: log, now: time.Now, after: ReprobeAfter,
		slots: make(chan struct{}, Slots())}
}

func (g *Gate) start() {
	g.mu.Lock()
	g.reprobeLocked()
	g.mu.Unlock()
}

// reprobeLocked starts a probe; the caller holds g.mu.
func (g *Gate) reprobeLocked() {
	done := make(chan struct{})
	g.done = done
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		p := g.run()
		g.mu.Lock()
		g.p, g.finished = p, g.now()
		g.mu.Unlock()
		close(done)
	}()
}

// run probes (or, without a CRIU, finds why not) and logs the outcome.
func (g *Gate) run() criu.Probe {
	var p criu.Probe
	if g.criuErr != nil {
		p.Reason = g.criuErr.Error()
	} else {
		p = g.probe(g.bg)
	}
	switch {
	case p.OK:
		g.log.Info("image parks available", "probe", p.Took, "notes", strings.Join(p.Notes, "; "))
	case g.bg.Err() != nil:
		g.log.Info("image park probe stopped: the daemon is shutting down", "probe", p.Took)
	default:
		g.log.Error("image parks unavailable on this host; transcript runs still work", "reason", p.Reason, "probe", p.Took)
	}
	return p
}

// Ready waits for the probe and returns nil when image parks work here, an
// error wrapping [ErrUnavailable] otherwise. A probe that failed over
// [ReprobeAfter] ago is run again first (unless the daemon is stopping).
func (g *Gate) Ready(ctx context.Context) error {
	g.mu.Lock()
	select {
	case <-g.done:
		if !g.p.OK && g.criuErr == nil && g.now().Sub(g.finished) > g.after && g.bg.Err() == nil {
			g.reprobeLocked()
		}
	default:
	}
	done := g.done
	g.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the image-park probe: %w", ctx.Err())
	}
	g.mu.Lock()
	p := g.p
	g.mu.Unlock()
	if !p.OK {
		return fmt.Errorf("%w: %s", ErrUnavailable, p.Reason)
	}
	return nil
}

// Slots is how many image parks' dumps and image resumes' restores run at
// once: one per processor the daemon may use (GOMAXPROCS), and at least
// two. Under load, more at once only share the processors: each takes as
// long as all of them, where admitted in turn the first finish first.
func Slots() int {
	return max(2, runtime.GOMAXPROCS(0))
}

// Admit waits on the gate (Ready), then for one of its slots, in the order
// asked (Slots): the caller dumps or restores, then calls release (once).
// Waiting for a slot ends with ctx.
func (g *Gate) Admit(ctx context.Context) (release func(), err error) {
	if err := g.Ready(ctx); err != nil {
		return nil, err
	}
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a slot to dump or restore in: %w", ctx.Err())
	}
	return sync.OnceFunc(func() { <-g.slots }), nil
}

// Expect says that a restore will ask for a slot soon, and whether it
// would find them crowded: the slots held, the dumps and restores
// waiting for one, and the restores expected before it, as many as the
// slots or more. done, called once the restore has asked (or will not),
// ends the expectation. A nil gate is never crowded.
func (g *Gate) Expect() (crowded bool, done func()) {
	if g == nil {
		return false, func() {}
	}
	before := g.expected.Add(1) - 1
	crowded = int64(len(g.slots))+g.waiting.Load()+before >= int64(cap(g.slots))
	return crowded, sync.OnceFunc(func() { g.expected.Add(-1) })
}

// UserNS reports whether image units run in user namespaces: the latest
// probe passed, a dump and restore in a user namespace too. False on a
// nil gate.
func (g *Gate) UserNS() bool {
	if g == nil {
		return false
	}
	return g.Status().UserNS
}

// State is where the gate stands.
type State int

const (
	Probing State = iota
	Available
	Unavailable
)

// String is the state as `runrecordd host` shows it.
func (s State) String() string {
	switch s {
	case Probing:
		return "probing"
	case Available:
		return "available"
	case Unavailable:
		return "unavailable"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Status is the latest probe's outcome. Reason (why not) is set only when
// Unavailable; Notes (how they work here) and Took only once a probe
// finished.
type Status struct {
	State  State
	Reason string
	Notes  []string
	Took   time.Duration
	// UserNS: image units run in user namespaces (the probe dumped and
	// restored in one).
	UserNS bool
}

// Status is the latest probe's outcome, or Probing while the first probe,
// or a reprobe, runs.
func (g *Gate) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.done:
	default:
		return Status{State: Probing}
	}
	p := g.p
	out := Status{State: Available, Notes: p.Notes, Took: p.Took, UserNS: p.OK && p.UserNS}
	if !p.OK {
		out.State, out.Reason = Unavailable, p.Reason
	}
	return out
}
