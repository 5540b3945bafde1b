package drain

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ErrUnfit is a host that cannot take a run: its manifest does not match
// the run's, it is being drained itself, image parks do not work there, or
// its egress ceiling refuses the run's grant (then also a bundle.ErrPolicy:
// grant_refused).
var ErrUnfit = errors.New("the host cannot take the run")

// ErrManifest is an ErrUnfit for a manifest that differs: the run's resume
// there would be refused (manifest_mismatch).
var ErrManifest = fmt.Errorf("%w: its manifest differs", ErrUnfit)

// ErrFormat is an ErrManifest for a host that does not read the format
// of the run's manifest: a runrecordd older than the one that parked it
// (docs/operations.md, "Upgrading").
var ErrFormat = fmt.Errorf("%w: it does not read the run's manifest format", ErrManifest)

// Need is what a run asks of the host that takes it.
type Need struct {
	Run string
	// Image is the unit's image by name: the host that takes it must
	// have it imported under the digest Manifest records.
	Image string
	// Manifest is the environment manifest the run's resume will be
	// judged against there: the one recorded, for a parked run; for an
	// executing one, the one its park on this host will record. Empty, it
	// is not judged here (the migration judges it).
	Manifest manifest.Manifest
	// ImagePark is a run whose resume restores a CRIU image.
	ImagePark bool
	Bytes     uint64
	// Grants is the run's grant set: an egress grant is held to the
	// host's egress ceiling, as its import there would hold it.
	Grants unit.Grants
}

// Offer is what a host said of itself before a drain: its facts as its
// manifests record them, the digests of the images asked about that it
// has, the room its store has left, whether it takes runs at all, and its
// egress ceiling (bundle.Policy's EgressAllow and EgressNames).
type Offer struct {
	Facts       manifest.Manifest
	Images      map[string]string // name → digest, for those it has
	Free        uint64
	Draining    bool
	ImageParks  bool // whether image parks work there
	EgressAllow []netip.Prefix
	EgressNames bool
	// PostCopy says the host takes a parked run post-copy (docs/fleet.md,
	// "Post-copy"): its source holds the run and says so (Handed.Held).
	PostCopy bool
}

// Fit says why the host that made o cannot take the run that needs n; nil
// when it can (its room is weighed in the drain). The manifest is judged
// as the resume there will judge it (manifest.Judge): the unit id is the
// run's own, the same everywhere; the image digest is the one the host has
// under the unit's image name. A refusal names the keys that fail, or
// ([ErrFormat]) the manifest format the host does not read. An egress
// grant is judged as the import there will judge it (bundle.CheckEgress).
func Fit(n Need, o Offer) error {
	switch {
	case o.Draining:
		return fmt.Errorf("%w: it is being drained", ErrUnfit)
	case n.ImagePark && !o.ImageParks:
		return fmt.Errorf("%w: image parks do not work there", ErrUnfit)
	}
	if err := bundle.CheckEgress(n.Grants, o.EgressAllow, o.EgressNames); err != nil {
		return fmt.Errorf("%w: %w", ErrUnfit, err)
	}
	// A host that reads format 2 states cpu.flags among its facts
	// (manifest.Host); one that states none reads format 1 only.
	if v := n.Manifest.Version(); v > manifest.Format1 {
		if _, ok := o.Facts[manifest.CPUFlags]; !ok {
			return fmt.Errorf("%w: the run's park records %s%d, and the host there reads %s1 only (it states no %s): upgrade its runrecordd first",
				ErrFormat, manifest.Domain, v, manifest.Domain, manifest.CPUFlags)
		}
	}
	there := manifest.Manifest{}
	for k, v := range o.Facts {
		there[k] = v
	}
	delete(there, manifest.ImageDigest)
	if d, ok := o.Images[n.Image]; ok {
		there[manifest.ImageDigest] = d
	}
	if id, ok := n.Manifest[manifest.UnitID]; ok {
		there[manifest.UnitID] = id
	}
	var diffs []string
	for _, d := range manifest.Judge(n.Manifest, there) {
		if len(diffs) == maxDiffs {
			diffs = append(diffs, "…")
			break
		}
		diffs = append(diffs, d.String())
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrManifest, strings.Join(diffs, "; "))
}

// maxDiffs bounds what a refusal quotes: a manifest and an offer are
// other hosts' words, and a refusal is kept per run per host.
const maxDiffs = 8

// TargetOf is host key as a drain places runs on it, from its offer (or why
// it made none).
func TargetOf(key record.Address, o Offer, err error, needs []Need) Target {
	h := Target{Key: key, Err: err}
	if err != nil {
		return h
	}
	h.Free, h.Refuses, h.PostCopy = o.Free, map[string]error{}, o.PostCopy
	for _, n := range needs {
		if err := Fit(n, o); err != nil {
			h.Refuses[n.Run] = err
		}
	}
	return h
}
