package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/resume"
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
	clock := newStepClock()
	ok, err := d.judgeResume(ctx, id, clock)
	if err != nil {
		return Resumed{}, err
	}
	// The idle energy the park owes ends where the restore begins; in a
	// fleet the Resumed segment that records it is reserved before any
	// unit runs (docs/fleet.md).
	owed, prov := idle.Owed(r.park, ok.retained, ok.parkedFor, d.meter.Coefficients())
	res, err := d.reserve(ctx, id, record.Resumption(ok.susp.Snapshot, owed.UJ, prov))
	if err != nil {
		return Resumed{}, fmt.Errorf("resume %s: %w", id, err)
	}
	run := forms.Run{ID: id, Spec: ok.spec, Grants: ok.grants}
	w, err := d.forms().For(ok.spec.Mode).Wake(ctx, run, forms.Waking{Snapshot: ok.susp.Snapshot, Retained: ok.retained, Teardown: r.teardown})
	if err != nil {
		res.cancel(ctx)
		return Resumed{}, err
	}
	lv := d.begin(id, w.Unit, w.Event, w.Mark)
	clock.mark("sandbox")
	lv.iv.Journal(attest.LifecycleOf(nowNS(), owed))
	for _, dt := range w.Details {
		lv.iv.Journal(attest.LifecycleOf(nowNS(), dt))
	}
	// Saved before the append: a daemon restarted after it attests the
	// interval from its start. (A crash before the append leaves a mark
	// the next resume overwrites.)
	d.saveMark(id, lv)
	d.reach("resume.restored")
	if err := res.append(ctx); err != nil {
		d.dropMark(id)
		lv.stopping = true
		d.destroy(lv)
		return Resumed{}, fmt.Errorf("resume %s: %w", id, err)
	}
	clock.mark("append")
	d.reach("resume.appended")
	r.live, r.park = lv, nil
	d.watch(id, r, lv)
	d.metrics.Resumed(clock.total(), owed.UJ, prov)
	sum, err := d.summary(id, r)
	if err != nil {
		return Resumed{}, err
	}
	d.publish(events.Event{Kind: "run.resumed", Run: id, Detail: fmt.Sprintf("idle %d uJ %s", owed.UJ, prov)})
	lv.unit.Serve(d.background)
	d.log.Info("run resumed", "run", id, "idle_uj", owed.UJ, "provenance", prov, "took", clock.total())
	return Resumed{Run: sum, Idle: owed, Restore: w.Restored, Took: clock.total(), Steps: clock.steps}, nil
}

// admitted is a parked run that passed the resume preconditions.
type admitted struct {
	susp      record.Segment // the Suspended segment it resumes from
	spec      unit.Spec
	grants    unit.Grants
	parkedFor time.Duration
	retained  int64
}

// judgeResume checks the three preconditions, in order (internal/resume): the
// snapshot the store offers is the one recorded, this host's manifest over
// the recorded keys hashes to the recorded address, and the record
// verifies from genesis. It changes nothing.
func (d *Daemon) judgeResume(ctx context.Context, id string, clock *stepClock) (admitted, error) {
	st, err := d.st.Run(id)
	if err != nil {
		return admitted{}, err
	}
	if err := phaseErr(id, st.Phase, record.Parked); err != nil {
		return admitted{}, err
	}
	if err := d.notHandedOff(id); err != nil {
		return admitted{}, err
	}
	raw, err := d.st.Raw(id)
	if err != nil {
		return admitted{}, &resume.RecordError{Err: err}
	}
	var ok admitted
	if ok.susp, err = resume.Suspension(raw.Segments); err != nil {
		return admitted{}, err
	}
	if ok.spec, ok.grants, err = d.unitOf(st); err != nil {
		return admitted{}, err
	}
	clock.mark("read")
	offered, err := park.Offered(ctx, d.st, ok.susp.Snapshot)
	if err != nil {
		return admitted{}, err
	}
	clock.mark("rehash")
	mb, err := d.st.ReadAll(ok.susp.Manifest)
	if err != nil {
		return admitted{}, fmt.Errorf("run %s: recorded manifest: %w", id, err)
	}
	recorded, err := manifest.Decode(mb)
	if err != nil {
		return admitted{}, fmt.Errorf("run %s: recorded manifest: %w", id, err)
	}
	err = resume.Check(resume.Inputs{
		Unit: raw.Unit, Grants: raw.Grants, Segments: raw.Segments, Heads: raw.Heads,
		Offered: offered, RecordedManifest: recorded, Host: d.hostFacts(ctx, ok.spec, st.Unit),
	})
	if err != nil {
		return admitted{}, fmt.Errorf("run %s: %w", id, err)
	}
	clock.mark("preconditions")
	if ok.parkedFor, err = d.parkedFor(id, raw.Segments); err != nil {
		return admitted{}, err
	}
	if ok.retained, err = park.Retained(d.st, ok.susp.Snapshot); err != nil {
		return admitted{}, err
	}
	clock.mark("idle")
	return ok, nil
}

// parkedFor is how long this host has held the run parked: since the end
// of the interval that parked it, as its attestation states — but never
// from before the run's record arrived here in a bundle. The end time of
// an imported run is another host's clock, and what this host meters is
// the idle draw of what it retained itself.
func (d *Daemon) parkedFor(id string, segs []record.Segment) (time.Duration, error) {
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].Kind != record.Executed {
			continue
		}
		b, err := d.attestation(segs[i].Attestation)
		if err != nil {
			return 0, err
		}
		since := time.Unix(0, b.EndNS)
		ret, err := d.st.RetentionOf(id)
		if err != nil {
			return 0, err
		}
		// The interval ended on another host (the run arrived in a
		// bundle after it): this host has held the park since the
		// bundle came, whatever that host's clock said.
		if !ret.Imported.IsZero() && i < ret.ImportedLen {
			since = ret.Imported
		}
		return max(time.Since(since), time.Nanosecond), nil
	}
	return 0, fmt.Errorf("%w: a parked run with no executed interval", ErrInvalid)
}

func (d *Daemon) attestation(a record.Address) (*attest.Body, error) {
	b, err := d.st.ReadAll(a)
	if err != nil {
		return nil, err
	}
	return attest.Open(b, nil)
}
