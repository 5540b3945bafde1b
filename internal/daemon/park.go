package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Park parks a running run: an image park for an image-mode unit, a
// transcript park for a transcript-mode one.
func (d *Daemon) Park(ctx context.Context, id string) (Parked, error) {
	r, err := d.lockRun(id)
	if err != nil {
		return Parked{}, err
	}
	defer r.mu.Unlock()
	return d.park(ctx, id, r)
}

func (d *Daemon) park(ctx context.Context, id string, r *run) (Parked, error) {
	clock := newStepClock()
	st, err := d.st.Run(id)
	if err != nil {
		return Parked{}, err
	}
	if err := phaseErr(id, st.Phase, record.Active); err != nil {
		return Parked{}, err
	}
	lv := r.live
	if lv == nil {
		return Parked{}, fmt.Errorf("run %s: %w", id, ErrNoSandbox)
	}
	var taken taken
	if lv.spec.Mode == unit.TranscriptMode {
		// Hold the channel: nothing reaches the transcript or the
		// account until the park is recorded (or refused, and the unit
		// goes on).
		lv.transcript.Gate().Lock()
		defer lv.transcript.Gate().Unlock()
		taken, err = d.sealTranscript(ctx, id, lv)
	} else {
		taken, err = d.checkpointImage(ctx, id, lv)
	}
	if err != nil {
		return Parked{}, err
	}
	clock.mark("snapshot")
	d.reach("park.checkpointed")
	ev, manAddr, err := d.recordPark(ctx, id, lv, st.Unit, taken, clock)
	if err != nil {
		return Parked{}, err
	}
	d.reach("park.appended")
	d.tearDownParked(r, lv)
	d.metrics.Parked(clock.total())
	sum, err := d.summary(id, r)
	if err != nil {
		return Parked{}, err
	}
	d.publish(events.Event{Kind: "run.parked", Run: id, Detail: taken.snap.String()})
	d.log.Info("run parked", "run", id, "snapshot", taken.snap.String(), "retained", taken.retained, "took", clock.total())
	return Parked{Run: sum, Snapshot: taken.snap, Manifest: manAddr, Retained: taken.retained, Receipt: ev.Receipt,
		Checkpoint: taken.checkpoint, Took: clock.total(), Steps: clock.steps}, nil
}

// taken is the snapshot a park took, before it is recorded.
type taken struct {
	snap       record.Snapshot
	retained   int64
	keys       []string             // the manifest keys its form records
	checkpoint *attest.Checkpointed // an image park's CRIU statistics
}

// sealTranscript freezes a transcript unit and seals its transcript. The
// caller holds the channel's gate. The unit stays frozen while the
// interval is recorded: a recorded park destroys the frozen sandbox, a
// refused one thaws it.
func (d *Daemon) sealTranscript(ctx context.Context, id string, lv *live) (taken, error) {
	if err := lv.sb.Pause(ctx); err != nil {
		return taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	snap, retained, err := lv.transcript.Seal(ctx)
	if err != nil {
		if rerr := lv.sb.Resume(context.Background()); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return taken{}, err
	}
	return taken{snap: snap, retained: retained, keys: manifest.TranscriptKeys}, nil
}

// checkpointImage checkpoints an image unit, leaving it frozen, and stores
// its images (internal/park), within the room the run has.
func (d *Daemon) checkpointImage(ctx context.Context, id string, lv *live) (taken, error) {
	if err := d.probe.Ready(ctx); err != nil {
		return taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	var mem uint64
	if u, err := lv.sb.Stats(ctx); err == nil {
		mem = u.MemoryBytes
	}
	raw, err := d.st.Raw(id)
	if err != nil {
		return taken{}, err
	}
	room, err := park.Room(d.st, id, lv.grants, mem, raw.Segments, d.cfg.MinFree)
	if err != nil {
		return taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	res, err := park.Image(ctx, d.st, lv.sb, d.criuDeadline(mem), room)
	if err != nil {
		return taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	ck := res.Checkpointed()
	return taken{snap: res.Snapshot, retained: res.Retained, keys: manifest.ImageKeys, checkpoint: &ck}, nil
}

// recordPark records the park: the manifest, then the interval's end with
// the Suspended segment (internal/interval). Refused, nothing is recorded
// and the unit goes on, thawed, in a new interval.
func (d *Daemon) recordPark(ctx context.Context, id string, lv *live, unitID record.Address, t taken, clock *stepClock) (interval.Sealed, record.Address, error) {
	man, err := d.manifestOver(ctx, t.keys, lv.spec, unitID)
	var manAddr record.Address
	if err == nil {
		manAddr, err = d.putManifest(man)
	}
	clock.mark("manifest")
	var susp record.Segment
	var outcome attest.Outcome
	if err == nil {
		outcome, susp, err = interval.Parked(t.snap, manAddr)
	}
	var ev interval.Sealed
	if err == nil {
		var extra []attest.Entry
		if t.checkpoint != nil {
			extra = append(extra, attest.LifecycleOf(nowNS(), *t.checkpoint))
		}
		ev, err = d.endAt(ctx, lv, "park.attested", outcome, lv.account(), []record.Segment{susp}, extra...)
	}
	clock.mark("record")
	if err == nil {
		return ev, manAddr, nil
	}
	if lv.transcript == nil {
		if rerr := lv.sb.Settle(context.Background()); rerr != nil {
			err = errors.Join(err, rerr)
		}
	} else if rerr := lv.sb.Resume(context.Background()); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if lv.iv.Ended() {
		d.restartInterval(id, lv, attest.EventParkRefused)
	}
	return interval.Sealed{}, record.Address{}, fmt.Errorf("park %s: %w", id, err)
}

// tearDownParked destroys a recorded park's sandbox behind the reply. A
// transcript run's next sandbox has another id and starts beside it; an
// image run's restore takes the same id and waits for it (r.teardown).
func (d *Daemon) tearDownParked(r *run, lv *live) {
	lv.stopping = true
	if lv.transcript != nil {
		lv.transcript.Close()
	}
	done := make(chan struct{})
	r.teardown = done
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		defer close(done)
		d.destroy(lv)
	}()
	r.live = nil
	r.park = d.meter.BeginPark()
}

// manifestOver returns this host's environment manifest over keys for a
// unit.
func (d *Daemon) manifestOver(ctx context.Context, keys []string, spec unit.Spec, unitID record.Address) (manifest.Manifest, error) {
	return manifest.Over(keys, d.hostFacts(ctx, spec, unitID))
}

// hostFacts are the host's facts for a unit: its own, and the digest under
// which the unit's image is imported here now (absent when it is not).
func (d *Daemon) hostFacts(ctx context.Context, spec unit.Spec, unitID record.Address) manifest.Manifest {
	m := manifest.Manifest{}
	for k, v := range d.host {
		m[k] = v
	}
	m[manifest.UnitID] = unitID.String()
	m[manifest.Protocol] = ProtocolVersion
	if img, err := d.ex.Image(ctx, spec.Image); err == nil {
		m[manifest.ImageDigest] = img.Digest
	}
	return m
}

func (d *Daemon) putManifest(m manifest.Manifest) (record.Address, error) {
	b, err := m.Canonical()
	if err != nil {
		return record.Address{}, err
	}
	return d.st.PutBytes(b)
}
