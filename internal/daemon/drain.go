package daemon

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/member"
	"github.com/runrecordd/runrecordd/internal/placement"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ErrDraining refuses a new run on a host being drained.
var ErrDraining = member.ErrDraining

// Drain moves every run this host holds (not closed, not handed off) to
// the fleet's other hosts by migration: to, or every other host whose live
// session serves the fleet; each where it fits ([member.Member.Drain],
// docs/fleet.md, "Drain"). From its start this host refuses new runs
// (ErrDraining) until it restarts.
func (d *Daemon) Drain(ctx context.Context, to []record.Address, parallel int) ([]drain.Outcome, error) {
	if d.session() == nil || d.cfg.Peers == nil {
		return nil, fmt.Errorf("drain: %w", member.ErrNoFleet)
	}
	d.draining.Store(true)
	runs, needs, err := d.held(ctx)
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	return d.fleet.Drain(ctx, to, parallel, runs, needs, d.migratePlaced)
}

// held lists the runs this host holds — not closed, not handed off — and
// what each needs of the host that takes it.
func (d *Daemon) held(ctx context.Context) ([]drain.Run, []drain.Need, error) {
	ids, err := d.st.AllRuns()
	if err != nil {
		return nil, nil, err
	}
	var runs []drain.Run
	var needs []drain.Need
	for _, id := range ids {
		s, err := d.Run(id)
		if err != nil {
			return nil, nil, err
		}
		if s.Phase == record.Ended || s.HandedOff || d.fleet.Elsewhere(id) != nil {
			continue // not this host's to move
		}
		r, n, err := d.need(ctx, id)
		if err != nil {
			// Its migration judges it: placement cannot.
			d.log.Warn("drain: the run is placed without judging its manifest", "run", id, "err", err)
			r, n = drain.Run{ID: id, Transcript: s.Spec != nil && s.Spec.Mode == unit.TranscriptMode}, drain.Need{Run: id}
		}
		runs, needs = append(runs, r), append(needs, n)
	}
	return runs, needs, nil
}

// Placement: before a drain moves anything, each host it may move runs to
// says what it can take (Offer, over the peer routes), and the drain judges
// each run against each offer (drain.Fit) — so an image run is never sent
// to a host whose manifest its resume would refuse, nor to one without
// room for it (docs/fleet.md, "Drain"; internal/placement).

// placement is this host's side of a drain's placement.
func (d *Daemon) placement() placement.Host {
	digest := func(ctx context.Context, name string) (string, error) {
		img, err := d.ex.Image(ctx, name)
		return img.Digest, err
	}
	return placement.Host{Store: d.st, Facts: d.host, Digest: digest, MinFree: d.cfg.MinFree, Draining: d.draining.Load,
		ImageParks: func() bool { return d.probe.Status().State != imageparks.Unavailable }}
}

// Offer is what this host can take now ([placement.Host.Offer]).
func (d *Daemon) Offer(ctx context.Context, images []string) (drain.Offer, error) {
	return d.placement().Offer(ctx, images)
}

// need is what run id, held here, asks of the host that takes it: for a
// parked run its recorded manifest and retained snapshot; for one
// executing, the manifest its park here will record and, for an image
// unit, its memory (its image's size).
func (d *Daemon) need(ctx context.Context, id string) (drain.Run, drain.Need, error) {
	r, err := d.lockRun(id)
	if err != nil {
		return drain.Run{}, drain.Need{}, err
	}
	defer r.mu.Unlock()
	return d.needOf(ctx, id, r)
}

// needOf is need with run id's lock held (r).
func (d *Daemon) needOf(ctx context.Context, id string, r *run) (drain.Run, drain.Need, error) {
	st, err := d.st.Run(id)
	if err != nil {
		return drain.Run{}, drain.Need{}, err
	}
	run, err := forms.ReadRun(d.st, st)
	if err != nil {
		return drain.Run{}, drain.Need{}, err
	}
	spec := run.Spec
	transcript := spec.Mode == unit.TranscriptMode
	n := drain.Need{Run: id, Image: spec.Image, ImagePark: !transcript}
	switch {
	case st.Phase == record.Parked:
		n.Manifest, n.Bytes, err = d.placement().Recorded(id)
	case r.live != nil:
		n.Manifest, err = d.forms().Over(ctx, manifest.KeysFor(transcript), spec, st.Unit)
		if u, serr := r.live.sb.Stats(ctx); serr == nil && !transcript {
			n.Bytes = u.MemoryBytes
		}
	}
	return drain.Run{ID: id, Transcript: transcript, Bytes: n.Bytes}, n, err
}
