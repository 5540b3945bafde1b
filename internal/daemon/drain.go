package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/imageparks"
)

// Placement: before a drain moves anything, each host it may move runs to
// says what it can take (Offer, over the peer routes), and the drain judges
// each run against each offer (drain.Fit) — so an image run is never sent
// to a host whose manifest its resume would refuse, nor to one without
// room for it (docs/fleet.md, "Drain"; internal/fleet/drain).

// placement is this host's side of a drain's placement.
func (d *Daemon) placement() drain.Local {
	digest := func(ctx context.Context, name string) (string, error) {
		img, err := d.ex.Image(ctx, name)
		return img.Digest, err
	}
	return drain.Local{Store: d.st, Facts: d.host, Digest: digest, MinFree: d.cfg.MinFree, Draining: func() bool { return d.fleet.Draining() },
		ImageParks: func() bool { return d.probe.Status().State != imageparks.Unavailable }, Forms: d.forms}
}

// Offer is what this host can take now ([drain.Local.Offer]).
func (d *Daemon) Offer(ctx context.Context, images []string) (drain.Offer, error) {
	return d.placement().Offer(ctx, images)
}
