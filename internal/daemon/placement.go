package daemon

import (
	"context"
	"fmt"
	"sync"

	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Placement: before a drain moves anything, each host it may move runs to
// says what it can take (Offer, over the peer routes), and the drain judges
// each run against each offer (drain.Fit) — so an image run is never sent
// to a host whose manifest its resume would refuse, nor to one without
// room for it (docs/fleet.md, "Drain").

// Offer is what this host can take now: its facts as its manifests record
// them, the digests of images (by name) it has imported, the room its store
// has left, and whether it takes runs at all.
func (d *Daemon) Offer(ctx context.Context, images []string) (drain.Offer, error) {
	o := drain.Offer{Facts: manifest.Manifest{manifest.Protocol: ProtocolVersion}, Images: map[string]string{},
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

// hostsFor asks each of hosts for its offer, at once, and judges needs
// against each.
func (d *Daemon) hostsFor(ctx context.Context, hosts []record.Address, needs []drain.Need) []drain.Host {
	seen := map[string]bool{}
	var images []string
	for _, n := range needs {
		if n.Image != "" && !seen[n.Image] {
			seen[n.Image] = true
			images = append(images, n.Image)
		}
	}
	out := make([]drain.Host, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() {
			o, err := d.cfg.Peers.Offer(ctx, h, images)
			out[i] = drain.HostOf(h, o, err, needs)
		})
	}
	wg.Wait()
	return out
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
	st, err := d.st.Run(id)
	if err != nil {
		return drain.Run{}, drain.Need{}, err
	}
	spec, _, err := d.unitOf(st)
	if err != nil {
		return drain.Run{}, drain.Need{}, err
	}
	transcript := spec.Mode == unit.TranscriptMode
	n := drain.Need{Run: id, Image: spec.Image, ImagePark: !transcript}
	switch {
	case st.Phase == record.Parked:
		n.Manifest, n.Bytes, err = d.recordedNeed(id)
	case r.live != nil:
		n.Manifest, err = d.manifestOver(ctx, manifest.KeysFor(transcript), spec, st.Unit)
		if u, serr := r.live.sb.Stats(ctx); serr == nil && !transcript {
			n.Bytes = u.MemoryBytes
		}
	}
	return drain.Run{ID: id, Transcript: transcript, Bytes: n.Bytes}, n, err
}

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
