package daemon

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/member"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ErrDraining refuses a new run on a host being drained.
var ErrDraining = member.ErrDraining

// DefaultDrainParallel is how many runs a drain moves at once unless told.
const DefaultDrainParallel = member.DefaultDrainParallel

// Drain moves every run this host holds (not closed, not handed off) to
// the fleet's other hosts by migration: to, or every other host whose live
// session serves the fleet; each where it fits ([member.Member.Drain],
// docs/fleet.md, "Drain"). From its start this host refuses new runs
// (ErrDraining) until it restarts.
func (d *Daemon) Drain(ctx context.Context, to []record.Address, parallel int) ([]drain.Outcome, error) {
	if d.session() == nil || d.cfg.Peers == nil {
		return nil, fmt.Errorf("drain: %w", ErrNoFleet)
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
// room for it (docs/fleet.md, "Drain").

// Offer is what this host can take now: its facts as its manifests record
// them, the digests of images (by name) it has imported, the room its store
// has left, and whether it takes runs at all.
func (d *Daemon) Offer(ctx context.Context, images []string) (drain.Offer, error) {
	o := drain.Offer{Facts: manifest.Manifest{manifest.Protocol: protocol.Version}, Images: map[string]string{},
		Draining: d.draining.Load(), ImageParks: d.probe.Status().State != imageparks.Unavailable}
	for k, v := range d.host {
		o.Facts[k] = v
	}
	for _, name := range images {
		if img, err := d.ex.Image(ctx, name); err == nil {
			o.Images[name] = img.Digest
		}
	}
	free, err := park.Free(d.st, d.cfg.MinFree)
	if err != nil {
		return drain.Offer{}, fmt.Errorf("placement: %w", err)
	}
	o.Free = free
	return o, nil
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
		n.Manifest, n.Bytes, err = d.recordedNeed(id)
	case r.live != nil:
		n.Manifest, err = d.forms().Over(ctx, manifest.KeysFor(transcript), spec, st.Unit)
		if u, serr := r.live.sb.Stats(ctx); serr == nil && !transcript {
			n.Bytes = u.MemoryBytes
		}
	}
	return drain.Run{ID: id, Transcript: transcript, Bytes: n.Bytes}, n, err
}

// fits says why this host could not resume parked run id, stored here,
// now: its recorded manifest judged against this host's offer as a drain
// judges it (drain.Fit) — before a received run is claimed.
func (d *Daemon) fits(ctx context.Context, id string) error {
	st, err := d.st.Run(id)
	if err != nil {
		return err
	}
	run, err := forms.ReadRun(d.st, st)
	if err != nil {
		return err
	}
	m, _, err := d.recordedNeed(id)
	if err != nil {
		return err
	}
	o, err := d.Offer(ctx, []string{run.Spec.Image})
	if err != nil {
		return err
	}
	o.Draining = false // judged on its own, under the run's lock
	return drain.Fit(drain.Need{Run: id, Image: run.Spec.Image, Manifest: m, ImagePark: run.Spec.Mode != unit.TranscriptMode}, o)
}

// maxNeedManifest is the largest recorded manifest a drain reads to place
// a run (a host's is about 3 KiB; an imported one may be anything).
const maxNeedManifest = 64 << 10

// recordedNeed is a parked run's recorded manifest and the bytes its
// snapshot holds.
func (d *Daemon) recordedNeed(id string) (manifest.Manifest, uint64, error) {
	raw, err := d.st.Raw(id)
	if err != nil {
		return nil, 0, err
	}
	susp, err := resume.Suspension(raw.Segments)
	if err != nil {
		return nil, 0, err
	}
	if size, err := d.st.Size(susp.Manifest); err != nil || size > maxNeedManifest {
		return nil, 0, fmt.Errorf("recorded manifest: %d bytes (at most %d judged here), %v", size, maxNeedManifest, err)
	}
	mb, err := d.st.ReadAll(susp.Manifest)
	if err != nil {
		return nil, 0, err
	}
	m, err := manifest.Decode(mb)
	if err != nil {
		return nil, 0, err
	}
	n, err := park.Retained(d.st, susp.Snapshot)
	return m, uint64(max(n, 0)), err
}
