// This host's side of a drain's placement (docs/fleet.md, "Drain"): what
// the host can take now (its Offer), what a parked run stored here needs of
// the host that takes it (Recorded), and whether this host could resume a
// parked run it stores (Fits). It reads the store and asks the executor
// for image digests, and never imports the daemon.

package drain

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Local is this host, as its side of a drain's placement sees it: what
// its offer is made of.
type Local struct {
	Store *store.Store
	// Facts are the host's own facts as its manifests record them.
	Facts manifest.Manifest
	// Digest is the digest of the image imported under name, or an error
	// when there is none.
	Digest func(ctx context.Context, name string) (string, error)
	// MinFree is the room the store keeps (park.Free).
	MinFree uint64
	// Draining says whether the host is being drained (it takes no runs).
	Draining func() bool
	// ImageParks says whether image parks work on the host.
	ImageParks func() bool
	// EgressAllow and EgressNames are the host's egress ceiling
	// (bundle.Policy).
	EgressAllow []netip.Prefix
	EgressNames bool
	// Forms is the host's side of the forms: the manifest a park here
	// would record.
	Forms Manifests
	// PostCopy says the host takes parked runs post-copy (Offer.PostCopy).
	PostCopy bool
	// Reserved, when not nil, is the room the store already owes
	// post-copy migrations (member.Reserved): not offered.
	Reserved func() (uint64, error)
}

// Manifests is the host's side of the forms as placement reads it: the
// manifest a park here of a unit would record (forms.Env).
type Manifests interface {
	Over(ctx context.Context, keys []string, spec unit.Spec, unitID record.Address) (manifest.Manifest, error)
}

// Memory reads an executing run's sandbox: the bytes of memory it holds
// now.
type Memory func(ctx context.Context) (uint64, error)

// Need is what stored run id asks of the host that takes it: parked, its
// recorded manifest and the bytes its snapshot retains; executing on this
// host (mem not nil, reading its sandbox), the manifest its park here will
// record and, for an image unit, its memory (its image's size).
func (h Local) Need(ctx context.Context, id string, mem Memory) (Need, error) {
	st, err := h.Store.Run(id)
	if err != nil {
		return Need{}, err
	}
	spec, grants, err := h.Store.ReadRun(st)
	if err != nil {
		return Need{}, err
	}
	transcript := spec.Mode == unit.TranscriptMode
	n := Need{Run: id, Image: spec.Image, ImagePark: !transcript, Grants: grants}
	switch {
	case st.Phase == record.PhaseParked:
		n.Manifest, n.Bytes, err = h.Recorded(id)
	case mem != nil:
		n.Manifest, err = h.Forms.Over(ctx, manifest.KeysFor(transcript), spec, st.Unit)
		if b, merr := mem(ctx); merr == nil && !transcript {
			n.Bytes = b
		}
	}
	return n, err
}

// Offer is what the host can take now: its facts, the digests of the
// images among images it has imported, the room its store has left (less
// Reserved), and whether it takes runs at all.
func (h Local) Offer(ctx context.Context, images []string) (Offer, error) {
	o := Offer{Facts: manifest.Manifest{manifest.Protocol: protocol.Version}, Images: map[string]string{},
		Draining: h.Draining(), ImageParks: h.ImageParks(), EgressAllow: h.EgressAllow, EgressNames: h.EgressNames, PostCopy: h.PostCopy}
	for k, v := range h.Facts {
		o.Facts[k] = v
	}
	for _, name := range images {
		if d, err := h.Digest(ctx, name); err == nil {
			o.Images[name] = d
		}
	}
	free, err := park.Free(h.Store, h.MinFree)
	if err != nil {
		return Offer{}, fmt.Errorf("placement: %w", err)
	}
	if h.Reserved != nil {
		r, err := h.Reserved()
		if err != nil {
			return Offer{}, fmt.Errorf("placement: %w", err)
		}
		free -= min(free, r)
	}
	o.Free = free
	return o, nil
}

// Fits says why this host could not resume parked run id, stored here,
// now: its recorded manifest judged against the host's offer as a drain
// judges it (Fit), whether or not the host is draining — before a
// received run is claimed, under the run's lock.
func (h Local) Fits(ctx context.Context, id string) error {
	st, err := h.Store.Run(id)
	if err != nil {
		return err
	}
	spec, grants, err := h.Store.ReadRun(st)
	if err != nil {
		return err
	}
	m, _, err := h.Recorded(id)
	if err != nil {
		return err
	}
	o, err := h.Offer(ctx, []string{spec.Image})
	if err != nil {
		return err
	}
	o.Draining = false
	return Fit(Need{Run: id, Image: spec.Image, Manifest: m, ImagePark: spec.Mode != unit.TranscriptMode, Grants: grants}, o)
}

// MaxManifest is the largest recorded manifest placement reads to judge a
// run (a host's is about 3 KiB; an imported one may be anything).
const MaxManifest = 64 << 10

// Recorded is parked run id's recorded manifest and the bytes its
// snapshot holds.
func (h Local) Recorded(id string) (manifest.Manifest, uint64, error) {
	raw, err := h.Store.Raw(id)
	if err != nil {
		return nil, 0, err
	}
	susp, err := resume.Suspension(raw.Segments)
	if err != nil {
		return nil, 0, err
	}
	if size, err := h.Store.Size(susp.Manifest); err != nil || size > MaxManifest {
		return nil, 0, fmt.Errorf("recorded manifest: %d bytes (at most %d judged here), %v", size, MaxManifest, err)
	}
	mb, err := h.Store.ReadAll(susp.Manifest)
	if err != nil {
		return nil, 0, err
	}
	m, err := manifest.Decode(mb)
	if err != nil {
		return nil, 0, err
	}
	n, err := park.Retained(h.Store, susp.Snapshot)
	return m, uint64(max(n, 0)), err
}
