package daemon

import (
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A run's need, executing and then parked, fits the offer of a host with
// the same facts and image, and no other: one whose CPU differs, one
// without the image, one being drained. What it needs once parked is the
// snapshot it retains; executing, its unit's memory.
func TestPlacementNeedAndOffer(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	ctx := t.Context()
	n, err := need(t, h.d, "r")
	if err != nil {
		t.Fatal(err)
	}
	if n.Bytes != 1<<20 || n.Manifest[manifest.ImageDigest] == "" || !n.ImagePark {
		t.Fatalf("executing: %+v", n)
	}
	o, err := h.d.place.Offer(ctx, []string{n.Image})
	if err != nil {
		t.Fatal(err)
	}
	if err := drain.Fit(n, o); err != nil || o.Free == 0 {
		t.Fatalf("this host's own offer (free %d): %v", o.Free, err)
	}
	if _, err := h.d.Park(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if parked, err := need(t, h.d, "r"); err != nil || parked.Bytes == 0 || parked.Manifest[manifest.UnitID] != n.Manifest[manifest.UnitID] {
		t.Fatalf("parked: %+v, %v", parked, err)
	} else {
		n = parked
	}
	if err := drain.Fit(n, o); err != nil {
		t.Fatalf("parked, against this host's offer: %v", err)
	}
	other := o
	other.Facts = manifest.Manifest{}
	for k, v := range o.Facts {
		other.Facts[k] = v
	}
	other.Facts[manifest.CPUFlags] = "none"
	noImage, _ := h.d.place.Offer(ctx, []string{"another"})
	p := &h.d.place
	p.Draining = func() bool { return true }
	draining, _ := p.Offer(ctx, []string{n.Image})
	for name, o := range map[string]drain.Offer{"cpu": other, "no image": noImage, "draining": draining} {
		if err := drain.Fit(n, o); !errors.Is(err, drain.ErrUnfit) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// One run a drain cannot judge (its image is gone from this host) does not
// stop the drain: it is listed with an empty need, for its migration to
// judge, beside the others.
func TestPlacementHeldOneBadRun(t *testing.T) {
	h := newFakeHost(t)
	h.ex.images["other"] = h.ex.images[fakeImage]
	h.start(t, "good")
	if _, err := h.d.Start(t.Context(), "bad", unit.Spec{Image: "other", Args: []string{"/unit"}}, unit.Grants{}); err != nil {
		t.Fatal(err)
	}
	delete(h.ex.images, "other")
	runs, needs, err := h.d.fleet.Holding(t.Context())
	if err != nil || len(runs) != 2 || len(needs) != 2 {
		t.Fatalf("held %v %v: %v", runs, needs, err)
	}
	for _, n := range needs {
		if (n.Run == "bad") != (n.Manifest == nil) {
			t.Fatalf("need %+v", n)
		}
	}
	h.teardown(t, "good")
	h.teardown(t, "bad")
}

// need is what stored run id asks of the host that takes it, as a drain
// asks it: held through the member room's run table.
func need(t *testing.T, d *Daemon, id string) (drain.Need, error) {
	t.Helper()
	held, release, err := fleetRuns{d}.Hold(id, false)
	if err != nil {
		return drain.Need{}, err
	}
	defer release()
	return held.Need(t.Context())
}
