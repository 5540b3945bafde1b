// Package retention is how long a store keeps what it no longer needs, and
// the collection that lets it go (docs/daemon.md, "Storage"). A closed run
// (or one handed off, or stored as a copy) keeps its record and evidence
// for good; its image snapshots go after a retention time unless the run is
// pinned; an object no record reaches goes after a grace period.
//
// It owns the defaults ([DefaultInterval], [DefaultKeep], [Grace]), one
// collection ([Collect]: release the expired snapshots, then the store's
// GC) and the periodic loop ([Loop]). It never imports internal/daemon, and
// composes internal/store calls ([store.Store.Expired], [store.Store.Release],
// [store.Store.GC]) without touching the store's files.
//
// Where to change what: which runs count as expired, and what a pin or a
// release records, is internal/store's retention.go; what the mark and sweep
// reach is internal/store's gc.go; the daemon keeps Pin (under the run's lock)
// and turns a [Result] into the API's.
package retention

import (
	"context"
	"log/slog"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
)

// Defaults of the daemon's collection (its --gc-interval and
// --snapshot-retention flags).
const (
	// DefaultInterval is how often the daemon collects its store.
	DefaultInterval = time.Hour
	// DefaultKeep is how long a closed run keeps its image snapshots.
	DefaultKeep = 24 * time.Hour
	// Grace keeps objects no record reaches yet: a park puts its objects
	// before the segment that names them, and an import adopts them
	// before it stores the record.
	Grace = time.Hour
	// first is how long after start the first periodic collection runs.
	first = time.Minute
)

// Policy is a daemon's retention as configured (serve --gc-interval and
// --snapshot-retention).
type Policy struct {
	// GCInterval is how often the daemon collects its store (releasing the
	// image snapshots of closed runs past SnapshotRetention, then removing
	// what no record reaches); 0 means DefaultInterval, negative never.
	GCInterval time.Duration
	// SnapshotRetention is how long a closed run keeps its image
	// snapshots; 0 means DefaultKeep, negative forever.
	SnapshotRetention time.Duration
}

// Interval is the collection interval configured as cfg: DefaultInterval
// when 0, negative for never.
func Interval(cfg time.Duration) time.Duration {
	if cfg == 0 {
		return DefaultInterval
	}
	return cfg
}

// Keep is the retention time configured as cfg: DefaultKeep when 0,
// negative for forever.
func Keep(cfg time.Duration) time.Duration {
	if cfg == 0 {
		return DefaultKeep
	}
	return cfg
}

// Result is what one collection did.
type Result struct {
	// Released are the runs whose image snapshots were released now.
	Released []string
	// Removed objects and their bytes.
	Removed      int
	RemovedBytes int64
	// Kept objects (reached, or young) and their bytes.
	Kept      int
	KeptBytes int64
}

// Collect releases the image snapshots of every run the store saw closed
// (or handed off) more than keep ago that is not pinned (negative keep
// releases none), then removes every object no record reaches that is
// older than grace (negative counts as 0). A grace shorter than the
// longest park or import can remove objects one is about to name. On an
// error from the store's GC, the result still says what was released.
func Collect(ctx context.Context, st *store.Store, keep, grace time.Duration, log *slog.Logger) (Result, error) {
	var out Result
	if keep >= 0 {
		released, err := release(st, keep, log)
		if err != nil {
			return out, err
		}
		out.Released = released
	}
	gs, err := st.GC(ctx, max(grace, 0))
	if err != nil {
		return out, err
	}
	out.Removed, out.RemovedBytes = gs.Removed, gs.RemovedBytes
	out.Kept, out.KeptBytes = gs.Kept(), gs.LiveBytes+gs.YoungBytes
	if gs.Removed > 0 || len(out.Released) > 0 {
		log.Info("gc", "released", len(out.Released), "removed", gs.Removed, "removed_bytes", gs.RemovedBytes, "kept", out.Kept, "kept_bytes", out.KeptBytes)
	}
	return out, nil
}

// release releases the snapshots of the runs expired keep ago, and
// returns those it released.
func release(st *store.Store, keep time.Duration, log *slog.Logger) ([]string, error) {
	expired, err := st.Expired(time.Now().Add(-keep))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range expired {
		if err := st.Release(id); err != nil {
			// Pinned since Expired listed it, say: the others go on.
			log.Info("gc: a run's snapshots kept", "run", id, "why", err)
			continue
		}
		out = append(out, id)
		log.Info("gc: released the image snapshots of a run closed or held elsewhere", "run", id, "retention", keep)
	}
	return out, nil
}

// Loop runs collect a minute after it starts (or every, if sooner) and
// then every interval, until ctx is done; a negative every never collects.
// A collection that fails is logged, unless ctx ended it, and the loop
// goes on.
func Loop(ctx context.Context, every time.Duration, collect func(context.Context) error, log *slog.Logger) {
	if every < 0 {
		return
	}
	t := time.NewTimer(min(first, every))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := collect(ctx); err != nil && ctx.Err() == nil {
			log.Error("periodic gc", "err", err)
		}
		t.Reset(every)
	}
}

// Collector is a store's collection as a daemon runs it: on demand (GC)
// and periodically (Run), with the daemon's configured retention time and
// interval.
type Collector struct {
	st             *store.Store
	keep, interval time.Duration
	log            *slog.Logger
}

// NewCollector collects st as p says (Keep and Interval).
func NewCollector(st *store.Store, p Policy, log *slog.Logger) Collector {
	return Collector{st: st, keep: Keep(p.SnapshotRetention), interval: Interval(p.GCInterval), log: log}
}

// GC releases the image snapshots of every closed run past the retention
// time (keep, or the collector's when nil; negative releases none) that
// is not pinned, then removes every object no record reaches that is
// older than the grace period (grace, or Grace when nil): Collect.
func (c Collector) GC(ctx context.Context, keep, grace *time.Duration) (Result, error) {
	k, g := c.keep, Grace
	if keep != nil {
		k = *keep
	}
	if grace != nil {
		g = *grace
	}
	return Collect(ctx, c.st, k, g, c.log)
}

// Run collects a minute after it starts and then every interval, until
// ctx is done (Loop).
func (c Collector) Run(ctx context.Context) {
	Loop(ctx, c.interval, func(ctx context.Context) error {
		_, err := c.GC(ctx, nil, nil)
		return err
	}, c.log)
}
