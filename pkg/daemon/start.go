package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/executor"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/store"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Start starts a run: the unit's sandbox first, then the run's genesis, so
// that a crash in between leaves an orphan sandbox (destroyed when the
// daemon reconciles) rather than a run with nothing behind it.
// An empty id draws one.
func (d *Daemon) Start(ctx context.Context, id string, spec unit.Spec, grants unit.Grants) (Summary, error) {
	if id == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		id = "r-" + hex.EncodeToString(b[:])
	}
	if err := checkID(id); err != nil {
		return Summary{}, err
	}
	spec, grants, sb, gb, err := d.prepareUnit(ctx, id, spec, grants)
	if err != nil {
		return Summary{}, err
	}
	r := d.lock(id)
	defer r.mu.Unlock()
	if _, err := d.st.Run(id); err == nil {
		return Summary{}, fmt.Errorf("run %s: %w", id, store.ErrRunExists)
	}
	unitID, err := d.st.PutBytes(sb)
	if err != nil {
		return Summary{}, err
	}
	grantsID, err := d.st.PutBytes(gb)
	if err != nil {
		return Summary{}, err
	}
	lv, err := d.startSandbox(ctx, id, spec, grants, nil)
	if err != nil {
		return Summary{}, err
	}
	d.saveMark(id, lv)
	d.reach("start.sandboxed")
	if _, err := d.st.Create(id, unitID, grantsID); err != nil {
		d.dropMark(id)
		lv.stopping = true
		d.destroy(lv)
		return Summary{}, err
	}
	r.live = lv
	d.watch(id, r, lv)
	d.log.Info("run started", "run", id, "image", spec.Image, "mode", spec.Mode)
	d.publish(events.Event{Kind: "run.started", Run: id, Detail: spec.Mode.String()})
	if lv.transcript != nil {
		lv.transcript.serve(d, id, lv)
	}
	return d.summary(id, r)
}

// prepareUnit fills in a run request's defaults and the daemon's nonce,
// pins the image's digest, and validates the unit and its grants,
// returning their canonical bytes.
func (d *Daemon) prepareUnit(ctx context.Context, id string, spec unit.Spec, grants unit.Grants) (unit.Spec, unit.Grants, []byte, []byte, error) {
	fail := func(err error) (unit.Spec, unit.Grants, []byte, []byte, error) {
		return unit.Spec{}, unit.Grants{}, nil, nil, err
	}
	if spec.Mode == 0 {
		spec.Mode = unit.ImageMode
	}
	if grants.Network == 0 {
		grants.Network = unit.NoNetwork
	}
	if spec.Image == "" {
		return fail(fmt.Errorf("%w: the unit names no image", ErrInvalid))
	}
	// Every run's genesis is its own: the daemon draws the nonce, so no
	// two runs, here or anywhere, share a unit_id or a head.
	if spec.Nonce != "" {
		return fail(fmt.Errorf("%w: the unit's nonce is the daemon's to draw, not the request's", ErrInvalid))
	}
	nonce, err := unit.NewNonce()
	if err != nil {
		return fail(err)
	}
	spec.Nonce = nonce
	img, err := d.ex.Image(ctx, spec.Image)
	if err != nil {
		return fail(fmt.Errorf("%w (import it with `runrecordd images import`)", err))
	}
	if spec.ImageDigest == "" {
		spec.ImageDigest = img.Digest
	} else if spec.ImageDigest != img.Digest {
		return fail(fmt.Errorf("image %s is %s, the unit names %s: %w", spec.Image, img.Digest, spec.ImageDigest, executor.ErrImageMismatch))
	}
	if err := spec.Validate(); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrInvalid, err))
	}
	if spec.Mode == unit.ImageMode {
		// An image run that could never park would hold its sandbox for
		// good: refused where image parks do not work.
		if err := d.imageParksReady(ctx); err != nil {
			return fail(fmt.Errorf("run %s: %w (a transcript unit can still run: --mode transcript)", id, err))
		}
	}
	if err := grants.Validate(); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrInvalid, err))
	}
	sb, err := spec.Canonical()
	if err != nil {
		return fail(err)
	}
	gb, err := grants.Canonical()
	if err != nil {
		return fail(err)
	}
	return spec, grants, sb, gb, nil
}

// startSandbox starts a fresh sandbox for the unit (a transcript unit with
// its channel; restored holds the transcript to restore, nil at a run's
// start).
func (d *Daemon) startSandbox(ctx context.Context, id string, spec unit.Spec, grants unit.Grants, restored *resumed) (*live, error) {
	es := executor.SpecOf(spec, grants)
	var sb Sandbox
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
// interval is metered and journaled from now. Only the interval is
// replaced: the exit watcher reads lv's sandbox meanwhile.
func (d *Daemon) restartInterval(id string, lv *live, event string) {
	lv.iv = d.begin(id, lv.sb, lv.spec, lv.grants, event, d.markNow(id)).iv
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
		_, err = d.endAt(context.Background(), lv, "exit.sealed", attest.Outcome{Kind: attest.Exited, Code: int32(code)}, lv.account(),
			[]record.Segment{record.Closure(reason)})
		if err != nil {
			d.log.Error("recording the unit's exit", "run", id, "err", err)
			return
		}
		lv.stopping = true
		d.destroy(lv)
		r.live = nil
		d.log.Info("run closed", "run", id, "reason", reason)
		d.publish(events.Event{Kind: "run.closed", Run: id, Detail: reason})
	}()
}
