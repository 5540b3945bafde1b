package daemon

import (
	"context"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// Storage retention (docs/daemon.md, "Storage"). A closed run keeps its
// record and its evidence; its image snapshots go SnapshotRetention after
// it closed, unless it is pinned. The daemon collects every GCInterval,
// and on `runrecordd gc`.
const (
	DefaultGCInterval        = time.Hour
	DefaultSnapshotRetention = 24 * time.Hour
	// gcGrace keeps objects no record reaches yet: a park puts its
	// objects before the segment that names them, and an import adopts
	// them before it stores the record.
	gcGrace = time.Hour
	// gcFirst is how long after start the first periodic collection runs.
	gcFirst = time.Minute
)

func (d *Daemon) gcInterval() time.Duration {
	if d.cfg.GCInterval == 0 {
		return DefaultGCInterval
	}
	return d.cfg.GCInterval
}

func (d *Daemon) retention() time.Duration {
	if d.cfg.SnapshotRetention == 0 {
		return DefaultSnapshotRetention
	}
	return d.cfg.SnapshotRetention
}

// startGC collects the store in the background, gcFirst after start and
// then every GCInterval.
func (d *Daemon) startGC() {
	every := d.gcInterval()
	if every < 0 {
		return
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		t := time.NewTimer(min(gcFirst, every))
		defer t.Stop()
		for {
			select {
			case <-d.bgCtx.Done():
				return
			case <-t.C:
			}
			if _, err := d.GC(d.bgCtx, nil, nil); err != nil && d.bgCtx.Err() == nil {
				d.log.Error("periodic gc", "err", err)
			}
			t.Reset(every)
		}
	}()
}

// GC releases the image snapshots of every closed run past the retention
// time (retention, or the daemon's when nil; negative releases none) that
// is not pinned, then removes every object no record reaches that is older
// than the grace period (grace, or an hour when nil). A grace shorter than
// the longest park or import can remove objects one is about to name.
func (d *Daemon) GC(ctx context.Context, retention, grace *time.Duration) (api.GC, error) {
	keep := d.retention()
	if retention != nil {
		keep = *retention
	}
	var out api.GC
	if keep >= 0 {
		expired, err := d.st.Expired(time.Now().Add(-keep))
		if err != nil {
			return out, err
		}
		for _, id := range expired {
			if err := d.st.Release(id); err != nil {
				// Pinned since Expired listed it, say: the others go on.
				d.log.Info("gc: a run's snapshots kept", "run", id, "why", err)
				continue
			}
			out.Released = append(out.Released, id)
			d.log.Info("gc: released the image snapshots of a run closed or held elsewhere", "run", id, "retention", keep)
		}
	}
	g := gcGrace
	if grace != nil {
		g = max(*grace, 0)
	}
	st, err := d.st.GC(ctx, g)
	if err != nil {
		return out, err
	}
	out.Removed, out.RemovedBytes = st.Removed, st.RemovedBytes
	out.Kept, out.KeptBytes = st.Kept(), st.LiveBytes+st.YoungBytes
	if st.Removed > 0 || len(out.Released) > 0 {
		d.log.Info("gc", "released", len(out.Released), "removed", st.Removed, "removed_bytes", st.RemovedBytes, "kept", out.Kept, "kept_bytes", out.KeptBytes)
	}
	return out, nil
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

// released reports whether run id's image snapshots were released.
func (d *Daemon) released(id string) bool {
	r, err := d.st.RetentionOf(id)
	return err == nil && !r.Released.IsZero()
}
