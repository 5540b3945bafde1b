package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/placement"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

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
	return placement.Host{Store: d.st, Facts: d.host, Digest: digest, MinFree: d.cfg.MinFree, Draining: func() bool { return d.fleet.Draining() },
		ImageParks: func() bool { return d.probe.Status().State != imageparks.Unavailable }}
}

// Offer is what this host can take now ([placement.Host.Offer]).
func (d *Daemon) Offer(ctx context.Context, images []string) (drain.Offer, error) {
	return d.placement().Offer(ctx, images)
}

// needOf is what run id, held here (r, its lock held), asks of the host
// that takes it: for a parked run its recorded manifest and retained
// snapshot; for one executing, the manifest its park here will record
// and, for an image unit, its memory (its image's size).
func (d *Daemon) needOf(ctx context.Context, id string, r *run) (drain.Need, error) {
	st, err := d.st.Run(id)
	if err != nil {
		return drain.Need{}, err
	}
	run, err := forms.ReadRun(d.st, st)
	if err != nil {
		return drain.Need{}, err
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
	return n, err
}
