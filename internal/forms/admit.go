package forms

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ErrFormMismatch is a run whose last park is not of its unit's form (an
// image snapshot for a transcript unit, or the other way round): its
// resume is refused (record_invalid), nothing changed.
var ErrFormMismatch = errors.New("the park's form is not the unit's")

// ErrNoEgress is a sandbox of a run granted network egress on a host that
// links none out (no serve --egress-allow): refused (grant_refused).
var ErrNoEgress = errors.New("network egress is not granted here")

// ResolvTarget is where a sandbox linked out has the host's
// [Linker.ResolvConf], read-only: its resolver is the gateway's.
const ResolvTarget = "/etc/resolv.conf"

// Admitted is a parked run that passed the resume preconditions: what
// its form wakes it from, and what its park owes.
type Admitted struct {
	Run
	Suspended record.Segment // the Suspended segment it resumes from
	ParkedFor time.Duration  // how long this host has held it parked
	Retained  int64          // the bytes its snapshot retains
	// Lazy is an image park restored lazily: the host restores lazily,
	// and its restores were not crowded when this one was admitted
	// (docs/lazy-resume.md, "Resume": crowded), or its snapshot's slabs
	// are owed (Owed).
	Lazy bool
	// Owed, when set, is the slabs of the snapshot a post-copy migration
	// still owes the store, lent to this resume (docs/fleet.md,
	// "Post-copy"): it is lazy, crowded or not, served, each chunk of them
	// fetched before it is served.
	Owed park.Owed
	// expecting ends the slot this resume is expected to ask the gate
	// for (imageparks.Gate.Expect): once it has asked (Waking.Asked), or
	// at Forget.
	expecting func()
}

// Waking is what the admitted run's form wakes it from.
func (a Admitted) Waking(teardown <-chan struct{}) Waking {
	return Waking{Snapshot: a.Suspended.Snapshot, Retained: a.Retained, Teardown: teardown, Lazy: a.Lazy, Asked: a.expecting, Owed: a.Owed}
}

// Forget ends what the admission told the image-park gate to expect: the
// resume calls it once done, woken or not (again, it does nothing).
func (a Admitted) Forget() {
	if a.expecting != nil {
		a.expecting()
	}
}

// prefetcher is a Sandboxes that can read an image restore's programs
// into the page cache ahead of the restore (*executor.Client).
type prefetcher interface{ Prefetch() }

// Admit checks the three resume preconditions of the parked run r, in
// order (internal/resume): the snapshot the store offers is the one
// recorded, this host satisfies the recorded manifest key by key
// (manifest.Judge; an image resume's probe-judged keys are judged by the
// image-park gate its wake waits on), and the record verifies from
// genesis. It changes
// nothing. mark, when set, ends each timed step (read, rehash,
// preconditions, idle). owed, when set, is the slabs a post-copy
// migration still owes (Admitted.Owed): only a host that restores lazily
// and serves the pages takes them.
func (h Env) Admit(ctx context.Context, r store.Run, mark func(step string), owed park.Owed) (_ Admitted, err error) {
	if mark == nil {
		mark = func(string) {}
	}
	raw, err := h.Store.Raw(r.ID)
	if err != nil {
		return Admitted{}, &resume.RecordError{Err: err}
	}
	var ok Admitted
	if ok.Suspended, err = resume.Suspension(raw.Segments); err != nil {
		return Admitted{}, err
	}
	ok.Run.ID = r.ID
	if ok.Run.Spec, ok.Run.Grants, err = h.Store.ReadRun(r); err != nil {
		return Admitted{}, err
	}
	if ok.Suspended.Snapshot.IsTranscript() != (ok.Run.Spec.Mode == unit.TranscriptMode) {
		// Nothing else ties a unit's mode to its park's form: a record
		// from elsewhere could pair them wrong, and the wrong form would
		// wake the unit from nothing.
		return Admitted{}, &resume.RecordError{Err: fmt.Errorf("%w: a %s unit parked in the other form", ErrFormMismatch, ok.Run.Spec.Mode)}
	}
	mark("read")
	if p, isP := h.Sandboxes.(prefetcher); isP && !ok.Suspended.Snapshot.IsTranscript() {
		p.Prefetch() // while the snapshot is rehashed
	}
	ok.Lazy = h.Lazy != nil && !ok.Suspended.Snapshot.IsTranscript()
	if owed != nil && !(ok.Lazy && h.LazyServed) {
		return Admitted{}, fmt.Errorf("run %s: %w: its slabs are owed, and this host does not serve a lazy restore", r.ID, store.ErrOwed)
	}
	ok.Owed = owed
	if ok.Lazy {
		// Crowded, a restore is eager: a lazy one's page server and
		// lazy-pages copy each byte twice more, on the processors the
		// restores waiting behind it need.
		crowded, done := h.Gate.Expect()
		defer func() {
			if err != nil {
				done()
			}
		}()
		// Owed slabs, it is lazy all the same: eager, it would wait for
		// every one of them.
		ok.Lazy, ok.expecting = !crowded || owed != nil, done
	}
	offer := park.Offered
	if ok.Lazy && h.LazyServed {
		// Pages served lazily are verified chunk by chunk as they are
		// served (internal/criu/pageserver); the rest is rehashed now.
		offer = func(ctx context.Context, st *store.Store, s record.Snapshot) (record.Snapshot, error) {
			return park.OfferedServedOwed(ctx, st, s, owed)
		}
	}
	offered, err := offer(ctx, h.Store, ok.Suspended.Snapshot)
	if err != nil {
		return Admitted{}, err
	}
	mark("rehash")
	mb, err := h.Store.ReadAll(ok.Suspended.Manifest)
	if err != nil {
		return Admitted{}, fmt.Errorf("run %s: recorded manifest: %w", r.ID, err)
	}
	recorded, err := manifest.Decode(mb)
	if err != nil {
		return Admitted{}, fmt.Errorf("run %s: recorded manifest: %w", r.ID, err)
	}
	err = resume.Check(resume.Inputs{
		Unit: raw.Unit, Grants: raw.Grants, Segments: raw.Segments, Heads: raw.Heads,
		Offered: offered, RecordedManifest: recorded, Host: h.facts(ctx, ok.Spec, r.Unit),
	})
	if err != nil {
		return Admitted{}, fmt.Errorf("run %s: %w", r.ID, err)
	}
	mark("preconditions")
	if ok.ParkedFor, err = h.parkedFor(r.ID, raw.Segments); err != nil {
		return Admitted{}, err
	}
	if ok.Retained, err = park.Retained(h.Store, ok.Suspended.Snapshot); err != nil {
		return Admitted{}, err
	}
	mark("idle")
	return ok, nil
}

// parkedFor is how long this host has held the run parked: since the end
// of the interval that parked it, as its attestation states — but never
// from before the run's record arrived here in a bundle. The end time of
// an imported run is another host's clock, and what this host meters is
// the idle draw of what it retained itself.
func (h Env) parkedFor(id string, segs []record.Segment) (time.Duration, error) {
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].Kind != record.Executed {
			continue
		}
		b, err := h.Store.ReadAll(segs[i].Attestation)
		if err != nil {
			return 0, err
		}
		body, err := attest.Open(b, nil)
		if err != nil {
			return 0, err
		}
		since := time.Unix(0, body.EndNS)
		ret, err := h.Store.RetentionOf(id)
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
	return 0, fmt.Errorf("%w: a parked run with no executed interval", h.Invalid)
}

// Manifest is this host's environment manifest over keys for a unit,
// stored; its address is what a park records.
func (h Env) Manifest(ctx context.Context, keys []string, spec unit.Spec, unitID record.Address) (record.Address, error) {
	m, err := h.Over(ctx, keys, spec, unitID)
	if err != nil {
		return record.Address{}, err
	}
	b, err := m.Canonical()
	if err != nil {
		return record.Address{}, err
	}
	return h.Store.PutBytes(b)
}

// Over is this host's environment manifest over keys for a unit, as a park
// here would record it (Manifest), not stored.
func (h Env) Over(ctx context.Context, keys []string, spec unit.Spec, unitID record.Address) (manifest.Manifest, error) {
	return manifest.Over(keys, h.facts(ctx, spec, unitID))
}

// facts are the host's facts for a unit: its own, and the digest under
// which the unit's image is imported here now (absent when it is not).
func (h Env) facts(ctx context.Context, spec unit.Spec, unitID record.Address) manifest.Manifest {
	m := manifest.Manifest{}
	for k, v := range h.Facts {
		m[k] = v
	}
	m[manifest.UnitID] = unitID.String()
	m[manifest.Protocol] = protocol.Version
	if img, err := h.Sandboxes.Image(ctx, spec.Image); err == nil {
		m[manifest.ImageDigest] = img.Digest
	}
	return m
}

// Prepare makes a run request's unit ready to run ([unit.Prepare]): its
// image pinned to the digest imported here, and refused where its form
// cannot park it (Form.Ready).
func (h Env) Prepare(ctx context.Context, id string, spec unit.Spec, grants unit.Grants) (unit.Prepared, error) {
	p, err := unit.Prepare(spec, grants, func(s unit.Spec) (string, error) {
		img, err := h.Sandboxes.Image(ctx, s.Image)
		if err != nil {
			return "", fmt.Errorf("%w (import it with `runrecordd images import`)", err)
		}
		if s.ImageDigest != "" && s.ImageDigest != img.Digest {
			return "", fmt.Errorf("image %s is %s, the unit names %s: %w", s.Image, img.Digest, s.ImageDigest, executor.ErrImageMismatch)
		}
		return img.Digest, nil
	})
	if err != nil {
		return unit.Prepared{}, err
	}
	if err := h.For(p.Spec.Mode).Ready(ctx, id); err != nil {
		return unit.Prepared{}, err
	}
	return p, nil
}
