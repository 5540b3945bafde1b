package daemon

import (
	"context"
	"time"

	"github.com/runrecordd/runrecordd/internal/retention"
)

// startGC collects the store in the background, a minute after start and
// then every GCInterval (retention.Loop).
func (d *Daemon) startGC() {
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		retention.Loop(d.bgCtx, retention.Interval(d.cfg.GCInterval), func(ctx context.Context) error {
			_, err := d.GC(ctx, nil, nil)
			return err
		}, d.log)
	}()
}

// GC releases the image snapshots of every closed run past the retention
// time (keep, or the daemon's when nil; negative releases none) that is
// not pinned, then removes every object no record reaches that is older
// than the grace period (grace, or an hour when nil): retention.Collect.
func (d *Daemon) GC(ctx context.Context, keep, grace *time.Duration) (retention.Result, error) {
	k, g := retention.Keep(d.cfg.SnapshotRetention), retention.Grace
	if keep != nil {
		k = *keep
	}
	if grace != nil {
		g = *grace
	}
	return retention.Collect(ctx, d.st, k, g, d.log)
}

// Pin keeps run id's snapshots whatever the retention time; Unpin lets
// them go with it again.
func (d *Daemon) Pin(id string, pin bool) (Summary, error) {
	r, err := d.lockRun(id)
	if err != nil {
		return Summary{}, err
	}
	defer r.mu.Unlock()
	if pin {
		err = d.st.Pin(id)
	} else {
		err = d.st.Unpin(id)
	}
	if err != nil {
		return Summary{}, err
	}
	return d.summary(id, r)
}
