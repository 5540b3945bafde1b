package daemon

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/warmpool"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Resume resumes a parked run on this host after the three preconditions,
// in order: the snapshot the store offers is the one recorded, this host's
// manifest over the recorded keys hashes to the recorded address, and the
// record verifies from genesis. A refusal changes nothing.
func (d *Daemon) Resume(ctx context.Context, id string) (Resumed, error) {
	r, err := d.lockRun(id)
	if err != nil {
		return Resumed{}, err
	}
	defer r.mu.Unlock()
	return d.resume(ctx, id, r)
}

func (d *Daemon) resume(ctx context.Context, id string, r *run) (Resumed, error) {
	clock := answers.NewClock()
	ok, err := d.judgeResume(ctx, id, clock)
	if err != nil {
		return Resumed{}, err
	}
	// The idle energy the park owes ends where the restore begins; in a
	// fleet the Resumed segment that records it is reserved before any
	// unit runs (docs/fleet.md).
	// A warm sandbox is taken only now, the resume admitted; what the
	// pool held for the run is its warm-pool residency, owed with the
	// park's (docs/warm-pool.md).
	waking := ok.Waking(r.teardown)
	var residency idle.Residency
	if ok.Spec.Mode == unit.TranscriptMode {
		var entry warmpool.Entry
		entry, residency = d.warm().Take(id)
		waking.Warm, _ = entry.(*forms.Warm)
	}
	owed, prov := idle.OwedWith(r.park, ok.Retained, ok.ParkedFor, d.meter.Coefficients(), residency)
	res, err := d.fleet.Reserve(ctx, id, record.Resumption(ok.Suspended.Snapshot, owed.UJ, prov))
	if err != nil {
		if waking.Warm != nil {
			_ = waking.Warm.Discard(context.WithoutCancel(ctx))
		}
		return Resumed{}, fmt.Errorf("resume %s: %w", id, err)
	}
	w, err := d.forms().For(ok.Spec.Mode).Wake(ctx, ok.Run, waking)
	if err != nil {
		res.Cancel(ctx)
		return Resumed{}, err
	}
	lv := d.begin(id, w.Unit, w.Event, w.Mark)
	clock.Mark("sandbox")
	lv.iv.Journal(attest.LifecycleOf(nowNS(), owed))
	for _, dt := range w.Details {
		lv.iv.Journal(attest.LifecycleOf(nowNS(), dt))
	}
	// Saved before the append: a daemon restarted after it attests the
	// interval from its start. (A crash before the append leaves a mark
	// the next resume overwrites.)
	d.saveMark(id, lv)
	d.reach("resume.restored")
	if err := res.Append(ctx); err != nil {
		d.dropMark(id)
		lv.stopping = true
		d.destroy(lv)
		return Resumed{}, fmt.Errorf("resume %s: %w", id, err)
	}
	clock.Mark("append")
	d.reach("resume.appended")
	r.live, r.park = lv, nil
	d.watch(id, r, lv)
	d.metrics.Resumed(clock.Total(), owed.UJ, prov)
	if ok.Spec.Mode == unit.TranscriptMode && d.warm() != nil {
		d.metrics.WarmResumed(w.Warm)
	}
	sum, err := d.summary(id, r)
	if err != nil {
		return Resumed{}, err
	}
	detail := fmt.Sprintf("idle %d uJ %s", owed.UJ, prov)
	if w.Warm {
		detail += " warm"
	}
	d.publish(events.Event{Kind: "run.resumed", Run: id, Detail: detail})
	lv.unit.Serve(d.background)
	d.log.Info("run resumed", "run", id, "idle_uj", owed.UJ, "provenance", prov, "warm", w.Warm, "took", clock.Total())
	return Resumed{Run: sum, Idle: owed, Restore: w.Restored, Took: clock.Total(), Steps: clock.Steps}, nil
}

// judgeResume admits parked run id for a resume, changing nothing: it is
// parked and held here, and passes the three preconditions, in order
// (forms.Host.Admit).
func (d *Daemon) judgeResume(ctx context.Context, id string, clock *answers.Clock) (forms.Admitted, error) {
	st, err := d.st.Run(id)
	if err != nil {
		return forms.Admitted{}, err
	}
	if err := phaseErr(id, st.Phase, record.Parked); err != nil {
		return forms.Admitted{}, err
	}
	if err := d.notHandedOff(id); err != nil {
		return forms.Admitted{}, err
	}
	return d.forms().Admit(ctx, st, clock.Mark)
}
