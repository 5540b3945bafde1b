package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Park parks a running run in its form (internal/forms): an image park
// for an image-mode unit, a transcript park for a transcript-mode one.
func (d *Daemon) Park(ctx context.Context, id string) (answers.Parked, error) {
	r, err := d.runs.lockRun(id)
	if err != nil {
		return answers.Parked{}, err
	}
	defer r.mu.Unlock()
	return d.park(ctx, id, r)
}

func (d *Daemon) park(ctx context.Context, id string, r *run) (answers.Parked, error) {
	clock := answers.NewClock()
	st, err := d.st.Run(id)
	if err != nil {
		return answers.Parked{}, err
	}
	if err := phaseErr(id, st.Phase, record.PhaseExecuting); err != nil {
		return answers.Parked{}, err
	}
	lv := r.live
	if lv == nil {
		return answers.Parked{}, fmt.Errorf("run %s: %w", id, answers.ErrNoSandbox)
	}
	// Hold the channel: nothing reaches the transcript or the account
	// until the park is recorded (or refused, and the unit goes on).
	defer lv.unit.Hold()()
	form := d.forms.For(lv.unit.Spec.Mode)
	// The manifest is the host's, not the snapshot's: it is stored while
	// the snapshot is taken.
	man := storeManifest(ctx, d.forms, form.Keys(), lv.unit.Spec, st.Unit)
	taken, err := form.Snapshot(ctx, lv.unit)
	if err != nil {
		return answers.Parked{}, err
	}
	clock.Mark("snapshot")
	d.reach("park.checkpointed")
	ev, manAddr, err := d.recordPark(ctx, id, lv, taking{Taken: taken, unitID: st.Unit, manifest: man, account: lv.unit.Account(), step: "park.attested", clock: clock})
	if err != nil {
		return answers.Parked{}, err
	}
	d.reach("park.appended")
	d.tearDownParked(r, lv)
	if !d.fleet.Draining() && !d.stopping.Load() { // a draining or stopping host's runs leave it
		d.forms.WarmUp(id, taken.Snapshot, func() bool {
			st, err := d.st.Run(id)
			return err == nil && st.Phase == record.PhaseParked && bundle.HeldHere(d.st, id) == nil
		})
	}
	d.metrics.Parked(clock.Total())
	sum, err := d.runs.summary(id, r)
	if err != nil {
		return answers.Parked{}, err
	}
	d.events.Publish(events.Event{Kind: "run.parked", Run: id, Detail: taken.Snapshot.String()})
	d.log.Info("run parked", "run", id, "snapshot", taken.Snapshot.String(), "retained", taken.Retained, "took", clock.Total())
	return answers.Parked{Run: sum, Snapshot: taken.Snapshot, Manifest: manAddr, Retained: taken.Retained, Receipt: ev.Receipt,
		Checkpoint: taken.Checkpoint, Took: clock.Total(), Steps: clock.Steps}, nil
}

// recordPark records the park: the manifest, then the interval's end with
// the Suspended segment (internal/interval). Refused, nothing is recorded
// and the unit goes on, thawed by its form, in a new interval.
func (d *Daemon) recordPark(ctx context.Context, id string, lv *live, tk taking) (interval.Sealed, record.Address, error) {
	ev, manAddr, err := d.recordTaken(ctx, lv, tk)
	if err == nil {
		return ev, manAddr, nil
	}
	if rerr := d.forms.For(lv.unit.Spec.Mode).Thaw(ctx, lv.unit); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if lv.iv.Ended() {
		d.intervals.restart(id, lv, attest.EventParkRefused)
	}
	return interval.Sealed{}, record.Address{}, fmt.Errorf("park %s: %w", id, err)
}

// taking is a snapshot taken of a live unit, as recordTaken records it.
type taking struct {
	forms.Taken
	unitID record.Address // the run's unit id, which its manifest binds
	// manifest, when set, is the manifest stored over Taken.Keys
	// (storeManifest); else recordTaken stores it.
	manifest func() (record.Address, error)
	account  *record.CallAccount // the interval's call account (nil: not accounted)
	step     string              // the failpoint armed between the sealing and the append
	clock    *answers.Clock      // times the manifest and the record, when set
}

// recordTaken records a snapshot taken of lv: this host's manifest over
// the form's keys, then the interval's end (with the account, and the
// form's lifecycle entries) and the Suspended segment.
func (d *Daemon) recordTaken(ctx context.Context, lv *live, tk taking) (interval.Sealed, record.Address, error) {
	t, clock := tk.Taken, tk.clock
	var manAddr record.Address
	var err error
	if tk.manifest != nil {
		manAddr, err = tk.manifest()
	} else {
		manAddr, err = d.forms.Manifest(ctx, t.Keys, lv.unit.Spec, tk.unitID)
	}
	clock.Mark("manifest")
	var susp record.Segment
	var outcome attest.Outcome
	if err == nil {
		outcome, susp, err = interval.Parked(t.Snapshot, manAddr)
	}
	var ev interval.Sealed
	if err == nil {
		ev, err = d.intervals.end(ctx, lv, tk.step, interval.Ending{Outcome: outcome, Calls: tk.account, Then: []record.Segment{susp}, Extra: attest.LifecyclesOf(nowNS(), t.Details)})
	}
	clock.Mark("record")
	return ev, manAddr, err
}

// storeManifest stores this host's manifest over keys for a unit on its
// own goroutine, and returns the wait for its address.
func storeManifest(ctx context.Context, env forms.Env, keys []string, spec unit.Spec, unitID record.Address) func() (record.Address, error) {
	type stored struct {
		addr record.Address
		err  error
	}
	done := make(chan stored, 1)
	go func() {
		a, err := env.Manifest(ctx, keys, spec, unitID)
		done <- stored{a, err}
	}()
	return sync.OnceValues(func() (record.Address, error) {
		s := <-done
		return s.addr, s.err
	})
}

// tearDownParked destroys a recorded park's sandbox behind the reply. A
// transcript run's next sandbox has another id and starts beside it; an
// image run's restore takes the same id and waits for it (r.teardown).
func (d *Daemon) tearDownParked(r *run, lv *live) {
	lv.stopping = true
	lv.unit.Close()
	done := make(chan struct{})
	r.teardown = done
	d.bg.Go(func() {
		defer close(done)
		lv.destroy(d.log)
	})
	r.live = nil
	r.park = d.meter.BeginPark()
}
