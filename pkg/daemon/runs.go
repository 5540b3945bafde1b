package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/executor"
	"github.com/runrecordd/runrecordd/pkg/idle"
	"github.com/runrecordd/runrecordd/pkg/manifest"
	"github.com/runrecordd/runrecordd/pkg/park"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/resume"
	"github.com/runrecordd/runrecordd/pkg/store"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Start starts a run: the unit's sandbox first, then the run's genesis, so
// that a crash in between leaves an orphan sandbox (destroyed when the
// daemon reconciles) rather than a run with nothing behind it.
func (d *Daemon) Start(ctx context.Context, req api.RunRequest) (api.Run, error) {
	id := req.ID
	if id == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		id = "r-" + hex.EncodeToString(b[:])
	}
	if err := checkID(id); err != nil {
		return api.Run{}, err
	}
	spec, grants := req.Unit, req.Grants
	if spec.Mode == 0 {
		spec.Mode = unit.ImageMode
	}
	if grants.Network == 0 {
		grants.Network = unit.NoNetwork
	}
	if spec.Image == "" {
		return api.Run{}, fmt.Errorf("%w: the unit names no image", ErrInvalid)
	}
	// Every run's genesis is its own: the daemon draws the nonce, so no
	// two runs, here or anywhere, share a unit_id or a head.
	if spec.Nonce != "" {
		return api.Run{}, fmt.Errorf("%w: the unit's nonce is the daemon's to draw, not the request's", ErrInvalid)
	}
	nonce, err := unit.NewNonce()
	if err != nil {
		return api.Run{}, err
	}
	spec.Nonce = nonce
	img, err := d.ex.Image(ctx, spec.Image)
	if err != nil {
		return api.Run{}, fmt.Errorf("%w (import it with `runrecordd images import`)", err)
	}
	if spec.ImageDigest == "" {
		spec.ImageDigest = img.Digest
	} else if spec.ImageDigest != img.Digest {
		return api.Run{}, fmt.Errorf("image %s is %s, the unit names %s: %w", spec.Image, img.Digest, spec.ImageDigest, executor.ErrImageMismatch)
	}
	if err := spec.Validate(); err != nil {
		return api.Run{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if spec.Mode == unit.ImageMode {
		// An image run that could never park would hold its sandbox for
		// good: refused where image parks do not work.
		if err := d.imageParksReady(ctx); err != nil {
			return api.Run{}, fmt.Errorf("run %s: %w (a transcript unit can still run: --mode transcript)", id, err)
		}
	}
	if err := grants.Validate(); err != nil {
		return api.Run{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	sb, err := spec.Canonical()
	if err != nil {
		return api.Run{}, err
	}
	gb, err := grants.Canonical()
	if err != nil {
		return api.Run{}, err
	}
	r := d.lock(id)
	defer r.mu.Unlock()
	if _, err := d.st.Run(id); err == nil {
		return api.Run{}, fmt.Errorf("run %s: %w", id, store.ErrRunExists)
	}
	unitID, err := d.st.PutBytes(sb)
	if err != nil {
		return api.Run{}, err
	}
	grantsID, err := d.st.PutBytes(gb)
	if err != nil {
		return api.Run{}, err
	}
	lv, err := d.startSandbox(ctx, id, spec, grants, nil)
	if err != nil {
		return api.Run{}, err
	}
	d.saveMark(id, lv)
	failpoint("start.sandboxed")
	if _, err := d.st.Create(id, unitID, grantsID); err != nil {
		d.dropMark(id)
		lv.stopping = true
		d.destroy(lv)
		return api.Run{}, err
	}
	r.live = lv
	d.watch(id, r, lv)
	d.log.Info("run started", "run", id, "image", spec.Image, "mode", spec.Mode)
	d.publish(api.Event{Kind: "run.started", Run: id, Detail: spec.Mode.String()})
	if lv.transcript != nil {
		lv.transcript.serve(d, id, lv)
	}
	return d.summary(id, r)
}

// startSandbox starts a fresh sandbox for the unit (a transcript unit with
// its channel; restored holds the transcript to restore, nil at a run's
// start).
func (d *Daemon) startSandbox(ctx context.Context, id string, spec unit.Spec, grants unit.Grants, restored *resumed) (*live, error) {
	es := executor.SpecOf(spec, grants)
	var sb *executor.Sandbox
	var ch *channel
	if spec.Mode == unit.TranscriptMode {
		var err error
		if ch, err = d.openChannel(id, restored, grants.Limits); err != nil {
			return nil, err
		}
		// Read-only: the unit reads its transcript and connects to the
		// socket (connecting writes nothing to the file system); it
		// cannot replace, add or remove anything the daemon reads. Own:
		// the daemon's own directory, under its state dir, noexec.
		es.Mounts = append(es.Mounts, executor.Mount{Source: ch.dir, Target: ChannelMount, Own: true})
	}
	out, err := d.output(id)
	m := d.markNow(id)
	if err == nil {
		sid := id
		if ch != nil {
			sid = sandboxID(id, ch.interval)
		}
		sb, err = d.ex.Start(ctx, sid, es, out)
	}
	if err != nil {
		if ch != nil {
			ch.close()
		}
		return nil, err
	}
	event := "started"
	if restored != nil {
		event = "resumed"
	}
	lv := d.begin(id, sb, spec, grants, event, m)
	lv.transcript = ch
	// The caller serves the channel once the run (or its Resumed
	// segment) is stored and announced: until then the unit's hello
	// waits in the listener's backlog.
	return lv, nil
}

// restartInterval starts a new interval on lv's sandbox after the end of
// the last one could not be recorded: the unit goes on, and the next
// interval is metered and journaled from now.
func (d *Daemon) restartInterval(id string, lv *live, event string) {
	nlv := d.begin(id, lv.sb, lv.spec, lv.grants, event, d.markNow(id))
	nlv.transcript = lv.transcript
	*lv = *nlv
	d.saveMark(id, lv)
}

// destroy removes a sandbox the daemon is done with. The caller holds the
// run's lock (or owns lv alone).
//
// The caller sets lv.stopping first, under the run's lock, when the exit
// watcher may see lv.
func (d *Daemon) destroy(lv *live) {
	if lv.transcript != nil {
		lv.transcript.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := lv.sb.Destroy(ctx); err != nil {
		d.log.Error("sandbox not destroyed; the next reconcile retries", "sandbox", lv.sb.ID(), "err", err)
	}
}

// watch closes the run when its unit exits by itself.
func (d *Daemon) watch(id string, r *run, lv *live) {
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		code, err := lv.sb.Wait(d.bgCtx)
		if d.bgCtx.Err() != nil {
			return // the daemon is stopping; the unit goes on without it
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.live != lv || lv.stopping {
			return
		}
		if err != nil {
			d.log.Error("waiting for the unit", "run", id, "err", err)
			return
		}
		reason := fmt.Sprintf("unit exited with code %d", code)
		_, err = d.end(context.Background(), lv, attest.Outcome{Kind: attest.Exited, Code: int32(code)}, lv.account(),
			[]record.Segment{record.Closure(reason)})
		if err != nil {
			d.log.Error("recording the unit's exit", "run", id, "err", err)
			return
		}
		lv.stopping = true
		d.destroy(lv)
		r.live = nil
		d.log.Info("run closed", "run", id, "reason", reason)
		d.publish(api.Event{Kind: "run.closed", Run: id, Detail: reason})
	}()
}

// append appends segs to run id at its current head, in one transaction.
func (d *Daemon) append(id string, segs ...record.Segment) error {
	head, err := d.st.Head(id)
	if err != nil {
		return err
	}
	_, err = d.st.AppendAll(id, head, segs...)
	return err
}

// phaseFor reports why a run in phase p cannot do what wants (nil when it
// can).
func phaseErr(id string, p record.Phase, want record.Phase) error {
	if p == want {
		return nil
	}
	switch p {
	case record.Ended:
		return fmt.Errorf("run %s: %w", id, record.ErrClosed)
	case record.Parked:
		return fmt.Errorf("run %s: %w", id, record.ErrParked)
	default:
		return fmt.Errorf("run %s: %w", id, record.ErrNotParked)
	}
}

// Park parks a running run: an image park for an image-mode unit, a
// transcript park for a transcript-mode one.
func (d *Daemon) Park(ctx context.Context, id string) (api.Park, error) {
	r, err := d.lockRun(id)
	if err != nil {
		return api.Park{}, err
	}
	defer r.mu.Unlock()
	return d.park(ctx, id, r)
}

func (d *Daemon) park(ctx context.Context, id string, r *run) (api.Park, error) {
	start := time.Now()
	st, err := d.st.Run(id)
	if err != nil {
		return api.Park{}, err
	}
	if err := phaseErr(id, st.Phase, record.Active); err != nil {
		return api.Park{}, err
	}
	lv := r.live
	if lv == nil {
		return api.Park{}, fmt.Errorf("run %s: %w", id, ErrNoSandbox)
	}
	var steps []api.Step
	last := start
	step := func(name string) {
		now := time.Now()
		steps = append(steps, api.Step{Name: name, NS: int64(now.Sub(last))})
		last = now
	}
	var (
		snap     record.Snapshot
		retained int64
		cp       *api.Checkpoint
		extra    []attest.Entry
		keys     []string
	)
	if lv.spec.Mode == unit.TranscriptMode {
		// Hold the channel: nothing reaches the transcript or the
		// account until the park is recorded (or refused, and the unit
		// goes on).
		//
		// The unit is frozen while its transcript is sealed and the
		// interval recorded; a recorded park destroys the frozen sandbox,
		// a refused one thaws it.
		lv.transcript.gate.Lock()
		defer lv.transcript.gate.Unlock()
		if err := lv.sb.Pause(ctx); err != nil {
			return api.Park{}, fmt.Errorf("park %s: %w", id, err)
		}
		snap, retained, err = lv.transcript.seal(ctx)
		if err != nil {
			if rerr := lv.sb.Resume(context.Background()); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return api.Park{}, err
		}
		keys = manifest.TranscriptKeys
	} else {
		if err := d.imageParksReady(ctx); err != nil {
			return api.Park{}, fmt.Errorf("park %s: %w", id, err)
		}
		var mem uint64
		if u, err := lv.sb.Stats(ctx); err == nil {
			mem = u.MemoryBytes
		}
		raw, err := d.st.Raw(id)
		if err != nil {
			return api.Park{}, err
		}
		room, err := d.roomForPark(id, lv.grants, mem, raw.Segments)
		if err != nil {
			return api.Park{}, fmt.Errorf("park %s: %w", id, err)
		}
		res, err := park.Image(ctx, d.st, lv.sb, d.criuDeadline(mem), room)
		if err != nil {
			return api.Park{}, fmt.Errorf("park %s: %w", id, err)
		}
		snap, retained = res.Snapshot, res.Retained
		cp = checkpointOf(res.Stats, res.Ingest)
		extra = append(extra, lifecycle("checkpointed", cp))
		keys = manifest.ImageKeys
	}
	step("snapshot")
	failpoint("park.checkpointed")
	man, err := d.manifestOver(ctx, keys, lv.spec, st.Unit)
	var manAddr record.Address
	if err == nil {
		manAddr, err = d.putManifest(man)
	}
	var ev interval.Sealed
	step("manifest")
	var susp record.Segment
	var outcome attest.Outcome
	if err == nil {
		outcome, susp, err = interval.Parked(snap, manAddr)
	}
	if err == nil {
		ev, err = d.endAt(ctx, lv, "park.attested", outcome, lv.account(), []record.Segment{susp}, extra...)
	}
	step("record")
	if err != nil {
		// Nothing was recorded: the unit goes on, in a new interval.
		if lv.transcript == nil {
			if rerr := lv.sb.Settle(context.Background()); rerr != nil {
				err = errors.Join(err, rerr)
			}
		} else if rerr := lv.sb.Resume(context.Background()); rerr != nil {
			err = errors.Join(err, rerr)
		}
		if lv.iv.Ended() {
			d.restartInterval(id, lv, "park-refused")
		}
		return api.Park{}, fmt.Errorf("park %s: %w", id, err)
	}
	failpoint("park.appended")
	// The park is recorded: the sandbox is torn down behind the reply.
	// A transcript run's next sandbox has another id and starts beside
	// it; an image run's restore takes the same id and waits for it
	// (r.teardown).
	lv.stopping = true
	if lv.transcript != nil {
		lv.transcript.close()
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
	d.metrics.parked(time.Since(start))
	sum, err := d.summary(id, r)
	if err != nil {
		return api.Park{}, err
	}
	d.publish(api.Event{Kind: "run.parked", Run: id, Detail: snap.String()})
	d.log.Info("run parked", "run", id, "snapshot", snap.String(), "retained", retained, "took", time.Since(start))
	return api.Park{Run: sum, Snapshot: snap.String(), Manifest: manAddr.String(), Retained: retained,
		Receipt: energyOf(ev.Receipt), Checkpoint: cp, DurationNS: int64(time.Since(start)), Steps: steps}, nil
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

// unitOf reads a run's unit spec and grant set from their objects.
func (d *Daemon) unitOf(st store.Run) (unit.Spec, unit.Grants, error) {
	sb, err := d.st.ReadAll(st.Unit)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, fmt.Errorf("run %s: unit spec: %w", st.ID, err)
	}
	spec, err := unit.DecodeSpec(sb)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, fmt.Errorf("run %s: unit spec: %w", st.ID, err)
	}
	gb, err := d.st.ReadAll(st.Grants)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, fmt.Errorf("run %s: grant set: %w", st.ID, err)
	}
	grants, err := unit.DecodeGrants(gb)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, fmt.Errorf("run %s: grant set: %w", st.ID, err)
	}
	return *spec, *grants, nil
}

// resumed is what a resume hands the new sandbox.
type resumed struct {
	transcript record.Address
}

// Resume resumes a parked run on this host after the three preconditions,
// in order: the snapshot the store offers is the one recorded, this host's
// manifest over the recorded keys hashes to the recorded address, and the
// record verifies from genesis. A refusal changes nothing.
func (d *Daemon) Resume(ctx context.Context, id string) (api.Resume, error) {
	r, err := d.lockRun(id)
	if err != nil {
		return api.Resume{}, err
	}
	defer r.mu.Unlock()
	return d.resume(ctx, id, r)
}

func (d *Daemon) resume(ctx context.Context, id string, r *run) (api.Resume, error) {
	start := time.Now()
	var steps []api.Step
	last := start
	step := func(name string) {
		now := time.Now()
		steps = append(steps, api.Step{Name: name, NS: int64(now.Sub(last))})
		last = now
	}
	st, err := d.st.Run(id)
	if err != nil {
		return api.Resume{}, err
	}
	if err := phaseErr(id, st.Phase, record.Parked); err != nil {
		return api.Resume{}, err
	}
	if err := d.notHandedOff(id); err != nil {
		return api.Resume{}, err
	}
	raw, err := d.st.Raw(id)
	if err != nil {
		return api.Resume{}, &resume.RecordError{Err: err}
	}
	susp, err := resume.Suspension(raw.Segments)
	if err != nil {
		return api.Resume{}, err
	}
	spec, grants, err := d.unitOf(st)
	if err != nil {
		return api.Resume{}, err
	}
	step("read")
	offered, err := park.Offered(ctx, d.st, susp.Snapshot)
	if err != nil {
		return api.Resume{}, err
	}
	step("rehash")
	mb, err := d.st.ReadAll(susp.Manifest)
	if err != nil {
		return api.Resume{}, fmt.Errorf("run %s: recorded manifest: %w", id, err)
	}
	recorded, err := manifest.Decode(mb)
	if err != nil {
		return api.Resume{}, fmt.Errorf("run %s: recorded manifest: %w", id, err)
	}
	err = resume.Check(resume.Inputs{
		Unit: raw.Unit, Grants: raw.Grants, Segments: raw.Segments, Heads: raw.Heads,
		Offered: offered, RecordedManifest: recorded, Host: d.hostFacts(ctx, spec, st.Unit),
	})
	if err != nil {
		return api.Resume{}, fmt.Errorf("run %s: %w", id, err)
	}
	step("preconditions")
	parkedFor, err := d.parkedFor(id, raw.Segments)
	if err != nil {
		return api.Resume{}, err
	}
	retained, err := park.Retained(d.st, susp.Snapshot)
	if err != nil {
		return api.Resume{}, err
	}

	step("idle")
	var lv *live
	var rst *api.Restore
	if susp.Snapshot.IsTranscript() {
		rs := &resumed{transcript: *susp.Snapshot.Transcript}
		if lv, err = d.startSandbox(ctx, id, spec, grants, rs); err != nil {
			return api.Resume{}, err
		}
	} else {
		if err := d.imageParksReady(ctx); err != nil {
			return api.Resume{}, fmt.Errorf("resume %s: %w", id, err)
		}
		if r.teardown != nil {
			select {
			case <-r.teardown: // the parked sandbox is gone; its id is free
			case <-ctx.Done():
				return api.Resume{}, ctx.Err()
			}
		}
		lv, rst, err = d.restore(ctx, id, spec, grants, susp.Snapshot, d.criuDeadline(uint64(retained)))
		if err != nil {
			return api.Resume{}, err
		}
	}
	var (
		uj     uint64
		prov   record.Provenance
		inputs map[string]string
	)
	if r.park != nil {
		uj, prov, inputs = r.park.End(uint64(retained), 0)
	} else {
		uj, prov, inputs = idle.Estimate(uint64(retained), 0, parkedFor, d.meter.Coefficients())
	}
	// A park always retains something (its record, its manifest): its
	// idle energy is never zero, and the record refuses a zero.
	if uj == 0 {
		uj = 1
		inputs["floor"] = "1"
	}
	step("sandbox")
	lv.iv.Journal(lifecycle("idle", map[string]any{"uj": uj, "provenance": prov.String(), "inputs": inputs, "retained_bytes": retained, "parked_ns": int64(parkedFor)}))
	if rst != nil {
		lv.iv.Journal(lifecycle("restored", rst))
	}
	// Saved before the append: a daemon restarted after it attests the
	// interval from its start. (A crash before the append leaves a mark
	// the next resume overwrites.)
	d.saveMark(id, lv)
	failpoint("resume.restored")
	if err := d.append(id, record.Resumption(susp.Snapshot, uj, prov)); err != nil {
		d.dropMark(id)
		lv.stopping = true
		d.destroy(lv)
		return api.Resume{}, fmt.Errorf("resume %s: %w", id, err)
	}
	step("append")
	failpoint("resume.appended")
	r.live, r.park = lv, nil
	d.watch(id, r, lv)
	d.metrics.resumed(time.Since(start), uj, prov)
	sum, err := d.summary(id, r)
	if err != nil {
		return api.Resume{}, err
	}
	d.publish(api.Event{Kind: "run.resumed", Run: id, Detail: fmt.Sprintf("idle %d uJ %s", uj, prov)})
	if lv.transcript != nil {
		lv.transcript.serve(d, id, lv)
	}
	d.log.Info("run resumed", "run", id, "idle_uj", uj, "provenance", prov, "took", time.Since(start))
	return api.Resume{Run: sum, Idle: api.Energy{UJ: uj, Provenance: prov.String(), Method: "idle-draw", Inputs: inputs},
		ParkedNS: int64(parkedFor), Restore: rst, DurationNS: int64(time.Since(start)), Steps: steps}, nil
}

// restore restores an image park's sandbox.
func (d *Daemon) restore(ctx context.Context, id string, spec unit.Spec, grants unit.Grants, snap record.Snapshot, deadline time.Duration) (*live, *api.Restore, error) {
	t0 := time.Now()
	dir := filepath.Join(d.cfg.StateDir, "restore", id)
	if err := os.RemoveAll(dir); err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	trees, err := park.Layout(d.st, snap, dir)
	if err != nil {
		return nil, nil, err
	}
	laid := time.Since(t0)
	out, err := d.output(id)
	if err != nil {
		return nil, nil, err
	}
	m := d.markNow(id)
	sb, rs, err := d.ex.Restore(ctx, id, executor.SpecOf(spec, grants), executor.Checkpoint{ImageDir: trees.ImageDir, Rootfs: trees.Rootfs, Deadline: deadline}, out)
	if err != nil {
		return nil, nil, fmt.Errorf("resume %s: %w", id, err)
	}
	lv := d.begin(id, sb, spec, grants, "restored", m)
	return lv, &api.Restore{TotalNS: int64(time.Since(t0)), MaterializeNS: int64(laid), RootfsNS: int64(rs.Rootfs),
		TaskNS: int64(rs.Task), ForkingNS: int64(rs.Forking), RestoreNS: int64(rs.Restore), Pages: rs.PagesRestored}, nil
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

// Close closes a run, in any phase: a running unit's interval is recorded
// (outcome killed) with the Closed segment, and then its sandbox destroyed.
func (d *Daemon) Close(ctx context.Context, id, reason string) (api.Run, error) {
	if reason == "" {
		reason = "closed by request"
	}
	r, err := d.lockRun(id)
	if err != nil {
		return api.Run{}, err
	}
	defer r.mu.Unlock()
	st, err := d.st.Run(id)
	if err != nil {
		return api.Run{}, err
	}
	if st.Phase == record.Ended {
		return api.Run{}, fmt.Errorf("run %s: %w", id, record.ErrClosed)
	}
	if err := d.notHandedOff(id); err != nil {
		return api.Run{}, err
	}
	closed := record.Closure(reason)
	lv := r.live
	if lv != nil && lv.transcript != nil {
		// As a park does: nothing reaches the account between its
		// sealing and the close.
		lv.transcript.gate.Lock()
		defer lv.transcript.gate.Unlock()
	}
	if lv != nil {
		_, err = d.end(ctx, lv, attest.Outcome{Kind: attest.Killed}, lv.account(), []record.Segment{closed})
	} else {
		err = d.append(id, closed)
	}
	if err != nil {
		if lv != nil && lv.iv.Ended() {
			d.restartInterval(id, lv, "close-refused")
		}
		return api.Run{}, fmt.Errorf("close %s: %w", id, err)
	}
	failpoint("close.appended")
	d.dropMark(id)
	if lv != nil {
		lv.stopping = true
		d.destroy(lv)
	}
	if r.teardown != nil {
		<-r.teardown
	}
	// Whatever else of the run this host still has goes too: the sandbox
	// of a run that was lost (its unit may be alive), or one a park left.
	d.removeSandboxes(ctx, id)
	r.live, r.park = nil, nil
	d.log.Info("run closed", "run", id, "reason", reason)
	d.publish(api.Event{Kind: "run.closed", Run: id, Detail: reason})
	return d.summary(id, r)
}

// summary is a run's api.Run.
func (d *Daemon) summary(id string, r *run) (api.Run, error) {
	st, err := d.st.Run(id)
	if err != nil {
		return api.Run{}, err
	}
	out := api.Run{ID: id, Phase: st.Phase.String(), Segments: st.Len, Head: st.Head.String(),
		Unit: st.Unit.String(), Grants: st.Grants.String()}
	if spec, _, err := d.unitOf(st); err == nil {
		out.Image, out.Mode = spec.Image, spec.Mode.String()
	}
	held, off, err := d.st.HandedOff(id)
	if err == nil && off {
		out.HandedOff = true
	}
	if ret, err := d.st.RetentionOf(id); err == nil {
		out.Pinned, out.Released = ret.Pinned, !ret.Released.IsZero()
	}
	switch {
	case st.Phase == record.Ended:
		out.Status = "closed"
	case out.HandedOff && held.Copy:
		out.Status = "copy"
	case out.HandedOff:
		out.Status = "handed off"
	case st.Phase == record.Parked && st.Parked.IsTranscript():
		out.Status = "parked (transcript)"
	case st.Phase == record.Parked:
		out.Status = "parked (image)"
	case r != nil && r.live != nil:
		out.Status = "running"
	default:
		out.Status = "lost"
	}
	return out, nil
}

// Run returns a run's summary.
func (d *Daemon) Run(id string) (api.Run, error) {
	d.mu.Lock()
	r := d.runs[id]
	d.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	return d.summary(id, r)
}

// List lists runs, in id order; phase filters when not empty.
func (d *Daemon) List(phase string) ([]api.Run, error) {
	var ids []string
	var err error
	switch phase {
	case "":
		ids, err = d.st.AllRuns()
	case "executing", "running":
		ids, err = d.st.Runs(record.Active)
	case "parked":
		ids, err = d.st.Runs(record.Parked)
	case "closed":
		ids, err = d.st.Runs(record.Ended)
	default:
		return nil, fmt.Errorf("%w: phase %q: use executing, parked or closed", ErrInvalid, phase)
	}
	if err != nil {
		return nil, err
	}
	out := make([]api.Run, 0, len(ids))
	for _, id := range ids {
		s, err := d.Run(id)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// reconcile makes containerd's sandboxes agree with the records after a
// restart: a run executing in its record gets its sandbox back (thawed if a
// park froze it and did not finish); a sandbox whose run is parked or
// closed — or that no run owns — is destroyed.
func (d *Daemon) reconcile(ctx context.Context) error {
	// No channel outlives the daemon that served it: every journal spool
	// found now is a dead interval's (its account is lost with it).
	if err := os.RemoveAll(filepath.Join(d.cfg.StateDir, "spool")); err != nil {
		d.log.Warn("reconcile: removing the journal spools of the last daemon", "err", err)
	}
	ids, err := d.ex.List(ctx)
	if err != nil {
		return err
	}
	// Each executing run keeps one sandbox: its own id, or for a transcript
	// run the latest interval's (an earlier one is a teardown that did
	// not finish).
	owner := map[string]string{}
	unsure := map[string]bool{} // runs whose record could not be read
	for _, sid := range ids {
		run := runOf(sid)
		st, err := d.st.Run(run)
		switch {
		case err != nil && !errors.Is(err, store.ErrNoRun):
			unsure[run] = true
			d.log.Error("reconcile: cannot read the run of a sandbox; leaving it", "sandbox", sid, "err", err)
		case err == nil && st.Phase == record.Active && newer(sid, owner[run]):
			owner[run] = sid
		}
	}
	for _, sid := range ids {
		if owner[runOf(sid)] == sid || unsure[runOf(sid)] {
			continue
		}
		d.log.Info("reconcile: removing a sandbox no executing run owns", "sandbox", sid, "run", runOf(sid))
		if err := d.ex.Remove(ctx, sid); err != nil {
			d.log.Error("reconcile: sandbox not removed; the next start retries", "sandbox", sid, "err", err)
		}
	}
	if pruned, err := d.ex.Prune(ctx); err != nil {
		d.log.Warn("reconcile: pruning the executor's leftovers", "err", err)
	} else if len(pruned) > 0 {
		d.log.Info("reconcile: removed network namespaces of sandboxes that are gone", "sandboxes", pruned)
	}
	active, err := d.st.Runs(record.Active)
	if err != nil {
		return err
	}
	for _, id := range active {
		if owner[id] == "" {
			d.log.Warn("reconcile: run is executing in its record but has no sandbox here (lost); close it or resume it elsewhere", "run", id)
			continue
		}
		// One run that cannot be taken back is reported lost; it does not
		// keep the daemon from starting.
		if err := d.reattachRun(ctx, id, owner[id]); err != nil {
			d.log.Error("reconcile: the run is lost until closed", "run", id, "sandbox", owner[id], "err", err)
		}
	}
	return nil
}

// newer reports whether sandbox a is a later interval's than b ("" is
// older than anything).
func newer(a, b string) bool {
	if b == "" {
		return true
	}
	return suffixN(a) > suffixN(b)
}

func suffixN(sid string) int64 {
	loc := transcriptSuffix.FindStringIndex(sid)
	if loc == nil {
		return 0
	}
	n, _ := strconv.ParseInt(sid[loc[0]+2:], 10, 64)
	return n
}

// reattachRun takes an executing run's sandbox back after a restart.
func (d *Daemon) reattachRun(ctx context.Context, id, sid string) error {
	st, err := d.st.Run(id)
	if err != nil {
		return err
	}
	spec, grants, err := d.unitOf(st)
	if err != nil {
		return err
	}
	sb, err := d.ex.Load(ctx, sid)
	if err != nil {
		return err
	}
	status, _ := sb.Status(ctx)
	if spec.Mode == unit.TranscriptMode && status != "stopped" {
		// Its channel went with the daemon that served it: park it from
		// the transcript on disk, unaccounted. (A unit that exited
		// meanwhile is closed by its watcher below, unaccounted too.)
		if err := d.recoverTranscript(ctx, id, d.reattach(id, sb, spec, grants)); err != nil {
			d.destroy(&live{sb: sb})
			return err
		}
		d.log.Warn("reconcile: parked a transcript unit whose channel did not survive the restart (its interval is unaccounted)", "run", id)
		return nil
	}
	if status != "stopped" {
		// A park the last daemon did not finish may have left the unit
		// frozen, or held by a CRIU that outlived the daemon: settled
		// by its real state.
		if err := sb.Settle(ctx); err != nil {
			return err
		}
		if status == "paused" || status == "pausing" {
			d.log.Info("reconcile: thawed a unit whose park did not complete", "run", id)
		}
	}
	r := d.lock(id)
	defer r.mu.Unlock()
	lv := d.reattach(id, sb, spec, grants)
	r.live = lv
	d.saveMark(id, lv)
	d.watch(id, r, lv)
	d.log.Info("reconcile: reattached", "run", id)
	return nil
}

// removeSandboxes removes every sandbox of run id that containerd still
// has, whatever state it is in. The caller holds the run's lock, and the
// run's record no longer needs them (closed).
func (d *Daemon) removeSandboxes(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	ids, err := d.ex.List(ctx)
	if err != nil {
		d.log.Error("listing sandboxes; the next reconcile removes what is left", "run", id, "err", err)
		return
	}
	for _, sid := range ids {
		if runOf(sid) != id {
			continue
		}
		d.log.Info("removing a sandbox of a closed run", "run", id, "sandbox", sid)
		if err := d.ex.Remove(ctx, sid); err != nil {
			d.log.Error("sandbox not removed; the next reconcile retries", "sandbox", sid, "err", err)
		}
	}
}

// sandboxID is the sandbox of a transcript run's interval n. Each interval
// of a transcript run gets its own sandbox id, so the next interval's
// sandbox can start while the last one is still being torn down. An image
// run's sandbox is the run id: its restore takes the place of the one
// checkpointed.
func sandboxID(run string, n int64) string { return fmt.Sprintf("%s_t%d", run, n) }

var transcriptSuffix = regexp.MustCompile(`_t[0-9]+$`)

// runOf is the run a sandbox belongs to.
func runOf(sid string) string {
	if loc := transcriptSuffix.FindStringIndex(sid); loc != nil {
		return sid[:loc[0]]
	}
	return sid
}
