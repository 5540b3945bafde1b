// Package warmpool is the host's bounded pool of warm sandboxes: the
// sandbox of a parked transcript run's next interval, made ahead of its
// resume (internal/forms: Transcript.Prepare), so that a posted result
// that wakes the run only starts a task (docs/warm-pool.md).
//
// A pool holds at most one sandbox per run, and at most Max at once; each
// for at most MaxAge. It makes them in the background, hands one to the
// run's next resume (Take), and discards them when the run is closed,
// leaves this host, or their time is up. Full, disabled or expired, a
// resume makes its sandbox as it did before. What each sandbox held while
// it waited is the run's warm-pool residency, owed in its next resume's
// idle energy (idle.Residency).
package warmpool

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/idle"
)

// Defaults of a pool (docs/warm-pool.md).
const (
	// DefaultMax is how many warm sandboxes a host keeps at once unless
	// told otherwise (serve --warm-pool).
	DefaultMax = 8
	// DefaultMaxAge is how long a warm sandbox waits for its run's
	// resume before it is discarded.
	DefaultMaxAge = 10 * time.Minute
	// DefaultSweep is how often the pool looks for sandboxes past their
	// age or whose run no longer waits here.
	DefaultSweep = 2 * time.Second
	// DefaultTimeout bounds the making of one warm sandbox.
	DefaultTimeout = time.Minute
)

// Entry is a warm sandbox (*forms.Warm).
type Entry interface {
	// Resident is the memory it holds while it waits.
	Resident(ctx context.Context) (uint64, error)
	// Discard removes it and what it was made with.
	Discard(ctx context.Context) error
}

// Config configures a pool.
type Config struct {
	// Max is how many warm sandboxes the pool holds at once; 0 (or
	// less) disables it: every resume makes its sandbox.
	Max int
	// MaxAge is how long one waits before it is discarded
	// (DefaultMaxAge when 0).
	MaxAge time.Duration
	// Sweep is how often the pool checks its sandboxes' age and runs
	// (DefaultSweep when 0); Timeout bounds the making of one
	// (DefaultTimeout when 0).
	Sweep, Timeout time.Duration
	// Meter meters each sandbox's residency; nil meters none.
	Meter *idle.Meter
	Log   *slog.Logger
}

// Pool is a host's warm sandboxes, by run. Its methods are safe for
// concurrent use; a nil Pool is disabled.
type Pool struct {
	cfg  Config
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	entries map[string]*slot
	// owed is the residency of a run's sandboxes discarded unused
	// (expired), owed at its next resume.
	owed  map[string]idle.Residency
	stats Stats
}

// slot is one run's warm sandbox. A slot in the pool's map is the pool's;
// whoever removes it from the map owns it (Take's caller, or a discard).
type slot struct {
	ready chan struct{} // closed once the making ended
	entry Entry         // set when the making succeeded (read after ready)
	made  time.Time
	res   *idle.Resident
	bytes uint64
	// keep reports whether the run still waits here for its resume.
	keep func() bool
	// gone is set while the pool discards the slot (it stays in the map
	// until then, so that nothing reuses its run's directories); it is
	// closed once the slot is discarded.
	gone chan struct{}
}

// Stats is what a pool holds and has done since it started.
type Stats struct {
	Max       int // the bound; 0: disabled
	Ready     int // warm sandboxes waiting for their run
	Preparing int // being made or discarded
	// Made counts sandboxes made; Used, resumes that took one; Missed,
	// resumes that found none; Refused, sandboxes not made because the
	// pool was full; Failed, makings that failed; Expired and Dropped,
	// sandboxes discarded past their age and for their run (closed,
	// handed off, migrated, or no longer waiting here).
	Made, Used, Missed, Refused, Failed, Expired, Dropped uint64
}

// New starts a pool; Close discards what it holds.
func New(cfg Config) *Pool {
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Sweep <= 0 {
		cfg.Sweep = DefaultSweep
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	p := &Pool{cfg: cfg, stop: make(chan struct{}), entries: map[string]*slot{}, owed: map[string]idle.Residency{}}
	if cfg.Max > 0 {
		p.wg.Add(1)
		go p.sweepLoop()
	}
	return p
}

// Enabled reports whether the pool makes sandboxes at all.
func (p *Pool) Enabled() bool { return p != nil && p.cfg.Max > 0 }

// Prepare makes run's warm sandbox in the background with build, unless the
// pool is disabled, closed or full (then it reports false, and the run's
// resume makes its sandbox as without a pool). keep, checked at each
// sweep, reports whether the run still waits here for its resume; when it
// does not, the sandbox is discarded. A sandbox the pool still holds for
// run is discarded first. The caller holds the run's lock.
func (p *Pool) Prepare(run string, build func(ctx context.Context) (Entry, error), keep func() bool) bool {
	if !p.Enabled() {
		return false
	}
	p.Discard(context.Background(), run, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if len(p.entries) >= p.cfg.Max {
		p.stats.Refused++
		return false
	}
	s := &slot{ready: make(chan struct{}), keep: keep}
	if p.cfg.Meter != nil {
		s.res = p.cfg.Meter.BeginResident()
	}
	p.entries[run] = s
	p.wg.Add(1)
	go p.makeSlot(run, s, build)
	return true
}

// makeSlot makes s's sandbox and measures what it holds.
func (p *Pool) makeSlot(run string, s *slot, build func(ctx context.Context) (Entry, error)) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	defer cancel()
	e, err := build(ctx)
	var bytes uint64
	if err == nil {
		if bytes, err = e.Resident(ctx); err != nil {
			p.cfg.Log.Warn("warm sandbox: its resident memory could not be read; none is counted", "run", run, "err", err)
			bytes, err = 0, nil
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.stats.Failed++
		p.cfg.Log.Warn("warm sandbox not made; the run's resume makes its sandbox", "run", run, "err", err)
		if p.entries[run] == s {
			delete(p.entries, run)
		}
	} else {
		p.stats.Made++
		s.entry, s.bytes, s.made = e, bytes, time.Now()
	}
	close(s.ready)
}

// owe adds r to what run owes at its next resume. The caller holds p.mu.
func (p *Pool) owe(run string, r idle.Residency) {
	if r.Sandboxes == 0 {
		return
	}
	o := p.owed[run]
	o.Add(r)
	p.owed[run] = o
}

// Take hands run's warm sandbox to its resume, waiting for one being made
// or discarded: nil when there is none. The caller owns the sandbox (its
// form starts or discards it). It returns too the residency the run owes:
// that of the sandbox taken and of any discarded unused since its park.
// The caller holds the run's lock, and has admitted the resume.
func (p *Pool) Take(run string) (Entry, idle.Residency) {
	if p == nil {
		return nil, idle.Residency{}
	}
	s := p.remove(run)
	p.mu.Lock()
	defer p.mu.Unlock()
	var e Entry
	if s != nil {
		e = s.entry
		if e != nil {
			p.owe(run, s.res.End(s.bytes))
		}
	}
	res := p.owed[run]
	delete(p.owed, run)
	if e != nil {
		p.stats.Used++
	} else {
		p.stats.Missed++
	}
	return e, res
}

// remove takes run's slot out of the pool once it is made (nil: none, or
// it was discarded meanwhile); the caller owns it.
func (p *Pool) remove(run string) *slot {
	for {
		p.mu.Lock()
		s := p.entries[run]
		if s == nil {
			p.mu.Unlock()
			return nil
		}
		if s.gone != nil {
			p.mu.Unlock()
			<-s.gone
			continue
		}
		delete(p.entries, run)
		p.mu.Unlock()
		<-s.ready
		return s
	}
}

// Discard removes run's warm sandbox, if the pool holds one, and waits
// until it is gone: when the run is closed, handed off or migrated. With
// forget, what the run owes of residency is dropped too (it will not
// resume here).
func (p *Pool) Discard(ctx context.Context, run string, forget bool) {
	if p == nil {
		return
	}
	if s := p.remove(run); s != nil && s.entry != nil {
		p.discard(ctx, run, s)
		p.mu.Lock()
		p.stats.Dropped++
		p.mu.Unlock()
	}
	if forget {
		p.mu.Lock()
		delete(p.owed, run)
		p.mu.Unlock()
	}
}

// discard removes s's sandbox, which the caller owns.
func (p *Pool) discard(ctx context.Context, run string, s *slot) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Timeout)
	defer cancel()
	if err := s.entry.Discard(ctx); err != nil {
		p.cfg.Log.Error("warm sandbox not removed; the next reconcile removes it", "run", run, "err", err)
	}
}

// Stats is what the pool holds and has done.
func (p *Pool) Stats() Stats {
	if p == nil {
		return Stats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Max = p.cfg.Max
	for _, s := range p.entries {
		select {
		case <-s.ready:
			if s.gone == nil && s.entry != nil {
				st.Ready++
				continue
			}
		default:
		}
		st.Preparing++
	}
	return st
}

// Close discards every warm sandbox and stops the pool: at the daemon's
// shutdown (a restarted daemon removes what a killed one left:
// docs/warm-pool.md).
func (p *Pool) Close(ctx context.Context) {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.stop)
	runs := make([]string, 0, len(p.entries))
	for run := range p.entries {
		runs = append(runs, run)
	}
	p.mu.Unlock()
	for _, run := range runs {
		p.Discard(ctx, run, true)
	}
	p.wg.Wait()
}
