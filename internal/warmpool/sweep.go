package warmpool

import (
	"context"
	"time"
)

// sweepLoop discards, every Sweep, the sandboxes past MaxAge and those
// whose run no longer waits here, until the pool closes.
func (p *Pool) sweepLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.Sweep)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			p.sweep(now)
		}
	}
}

// sweep discards the ready sandboxes made before now − MaxAge (their
// residency stays owed by the run) and those whose run's keep says no
// (closed, handed off, migrated: nothing is owed, the run does not
// resume here).
func (p *Pool) sweep(now time.Time) {
	type doomed struct {
		run     string
		s       *slot
		expired bool
	}
	var ready []doomed
	p.mu.Lock()
	for run, s := range p.entries {
		select {
		case <-s.ready:
		default:
			continue
		}
		if s.gone == nil && s.entry != nil {
			ready = append(ready, doomed{run, s, now.Sub(s.made) > p.cfg.MaxAge})
		}
	}
	p.mu.Unlock()
	for _, d := range ready {
		if !d.expired && (d.s.keep == nil || d.s.keep()) {
			continue
		}
		p.mu.Lock()
		if p.entries[d.run] != d.s || d.s.gone != nil {
			p.mu.Unlock() // taken or discarded meanwhile
			continue
		}
		d.s.gone = make(chan struct{})
		p.mu.Unlock()
		p.discard(context.Background(), d.run, d.s)
		p.mu.Lock()
		delete(p.entries, d.run)
		if d.expired {
			p.stats.Expired++
			p.owe(d.run, d.s.res.End(d.s.bytes))
		} else {
			p.stats.Dropped++
			delete(p.owed, d.run)
		}
		close(d.s.gone)
		p.mu.Unlock()
	}
}
