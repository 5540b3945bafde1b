package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Start starts a run: the unit's sandbox first, then the run's genesis, so
// that a crash in between leaves an orphan sandbox (destroyed when the
// daemon reconciles) rather than a run with nothing behind it. An empty
// id draws one.
func (d *Daemon) Start(ctx context.Context, id string, spec unit.Spec, grants unit.Grants) (answers.Summary, error) {
	return d.StartBooked(ctx, id, spec, grants, answers.Starting{})
}

// StartBooked is Start, with what the request brings beside the unit
// (answers.Starting): the run booked by its Booking (when not nil) under
// the run's lock once its id is known to be free here, before its claim,
// its sandbox or its genesis, a start that then leaves no run unbooked;
// and its secrets' values, which the grant set names (secrets.go) and
// this host keeps until the run closes or leaves.
func (d *Daemon) StartBooked(ctx context.Context, id string, spec unit.Spec, grants unit.Grants, o answers.Starting) (answers.Summary, error) {
	b := o.Booking
	if d.fleet.Draining() {
		return answers.Summary{}, fmt.Errorf("run: %w: it takes no new runs until it restarts", member.ErrDraining)
	}
	if d.stopping.Load() {
		return answers.Summary{}, fmt.Errorf("run: %w", answers.ErrStopping)
	}
	if id == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		id = "r-" + hex.EncodeToString(b[:])
	}
	if err := forms.CheckID(id); err != nil {
		return answers.Summary{}, err
	}
	if err := bundle.CheckEgress(grants, d.cfg.EgressAllow, d.cfg.EgressResolver.IsValid()); err != nil {
		return answers.Summary{}, fmt.Errorf("run %s: %w", id, err)
	}
	if grants.Network == unit.Egress && spec.Mode == unit.TranscriptMode {
		// Its outward calls go through the platform, by design.
		return answers.Summary{}, fmt.Errorf("run %s: %w: network egress is for image units; a transcript unit calls out through its platform", id, answers.ErrInvalid)
	}
	grants, err := secretNames(id, grants, o.Secrets)
	if err != nil {
		return answers.Summary{}, err
	}
	p, err := d.forms.Prepare(ctx, id, spec, grants)
	if err != nil {
		return answers.Summary{}, err
	}
	r := d.runs.lock(id)
	defer r.mu.Unlock()
	if _, err := d.st.Run(id); err == nil {
		return answers.Summary{}, fmt.Errorf("run %s: %w", id, store.ErrRunExists)
	}
	if b != nil {
		if err := b.Book(id); err != nil {
			return answers.Summary{}, fmt.Errorf("run %s: %w", id, err)
		}
		defer func() {
			if _, serr := d.st.Run(id); serr == nil {
				return // the run exists: its booking stays
			}
			if uerr := b.Unbook(id); uerr != nil {
				d.log.Error("a refused start's booking stays", "run", id, "err", uerr)
			}
		}()
	}
	if p.Grants.Network == unit.Egress {
		defer func() {
			if _, serr := d.st.Run(id); serr != nil {
				d.links.Release(id) // no run: its link goes
			}
		}()
	}
	if len(p.Grants.Secrets) > 0 {
		defer func() {
			if _, serr := d.st.Run(id); serr != nil {
				dropSecrets(d.secrets, id, d.log) // no run: its values go
			}
		}()
		if err := d.secrets.Put(id, o.Secrets); err != nil {
			return answers.Summary{}, fmt.Errorf("run %s: %w", id, err)
		}
	}
	unitID, err := d.st.PutBytes(p.SpecBytes)
	if err != nil {
		return answers.Summary{}, err
	}
	grantsID, err := d.st.PutBytes(p.GrantsBytes)
	if err != nil {
		return answers.Summary{}, err
	}
	// In a fleet the run is this host's before its unit runs.
	genesis := record.Genesis(unitID, grantsID)
	if err := d.fleet.Claim(ctx, id, genesis); err != nil {
		return answers.Summary{}, fmt.Errorf("run %s: %w", id, err)
	}
	w, err := d.forms.For(p.Spec.Mode).Start(ctx, forms.Run{ID: id, Spec: p.Spec, Grants: p.Grants})
	if err != nil {
		d.fleet.Unclaim(ctx, id, genesis)
		return answers.Summary{}, err
	}
	lv := d.intervals.begin(id, w.Unit, w.Event, w.Mark)
	d.intervals.SaveMark(lv.iv)
	d.reach("start.sandboxed")
	if _, err := d.st.Create(id, unitID, grantsID); err != nil {
		d.intervals.DropMark(id)
		lv.stopping = true
		lv.destroy(d.log)
		d.fleet.Unclaim(ctx, id, genesis)
		return answers.Summary{}, err
	}
	r.live = lv
	d.watch(id, r, lv)
	d.log.Info("run started", "run", id, "image", p.Spec.Image, "mode", p.Spec.Mode)
	d.events.Publish(events.Event{Kind: "run.started", Run: id, Detail: p.Spec.Mode.String()})
	lv.unit.Serve(d.bg.Go)
	return d.runs.summary(id, r)
}

// watch closes the run when its unit exits by itself.
func (d *Daemon) watch(id string, r *run, lv *live) {
	d.bg.Go(func() {
		code, err := lv.sb.Wait(d.bgCtx)
		if d.bgCtx.Err() != nil {
			return // the daemon is stopping; the unit goes on without it
		}
		if done := lv.unit.PagesDone(); err == nil && done != nil {
			// A unit killed because its lazy pages were lost did not
			// exit by itself: watchPages parks it back.
			select {
			case <-done:
			case <-d.bgCtx.Done():
				return
			}
			if lv.unit.PagesLost() {
				return
			}
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
		_, err = d.intervals.end(context.Background(), lv, "exit.sealed", interval.Ending{Outcome: attest.Outcome{Kind: attest.Exited, Code: int32(code)}, Calls: lv.unit.Account(), Then: []record.Segment{record.Closure(reason)}})
		if err != nil { // the run stays executing in its record: a close records it, in a new interval
			d.log.Error("recording the unit's exit", "run", id, "err", err)
			d.intervals.restart(id, lv, attest.EventExitRefused)
			return
		}
		lv.stopping = true
		lv.destroy(d.log)
		r.live = nil
		dropSecrets(d.secrets, id, d.log)
		d.links.Release(id)
		d.log.Info("run closed", "run", id, "reason", reason)
		d.events.Publish(events.Event{Kind: "run.closed", Run: id, Detail: reason})
	})
}
