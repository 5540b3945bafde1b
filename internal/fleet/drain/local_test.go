package drain

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/testhost"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A parked run's recorded need is its manifest and the bytes its snapshot
// retains; a recorded manifest larger than MaxManifest is not read.
func TestRecorded(t *testing.T) {
	h := testhost.New(t, "")
	p := Local{Store: h.Store}
	m := manifest.Manifest{manifest.CPUFeatures: "sse2", manifest.UnitID: "u"}
	canon, err := m.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	h.Start(t, "r")
	h.Append(t, "r", record.Execution(h.Put(t, []byte("attestation")), nil), record.Suspension(h.TranscriptPark(t, 100), h.Put(t, canon)))
	got, n, err := p.Recorded("r")
	if err != nil || n != 100 || got[manifest.CPUFeatures] != "sse2" {
		t.Fatalf("recorded %v, %d bytes: %v", got, n, err)
	}
	h.Start(t, "big")
	// A well-formed manifest, only too large to be judged here.
	bigm, err := manifest.Manifest{manifest.CPUFeatures: strings.Repeat("x", MaxManifest)}.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	big := h.Put(t, bigm)
	h.Append(t, "big", record.Execution(h.Put(t, []byte("attestation 2")), nil), record.Suspension(h.TranscriptPark(t, 1), big))
	if _, _, err := p.Recorded("big"); err == nil {
		t.Fatal("a manifest over the bound was read")
	}
	if _, _, err := p.Recorded("nosuch"); err == nil {
		t.Fatal("an unknown run has a need")
	}
}

// An offer carries the host's facts, the digests of the images it has
// among those named, whether it drains and takes image parks, and its
// room; a store it cannot measure refuses the offer.
func TestOffer(t *testing.T) {
	h := testhost.New(t, "")
	digest := func(_ context.Context, name string) (string, error) {
		if name == "have" {
			return "sha256:1", nil
		}
		return "", errors.New("no such image")
	}
	p := Local{Store: h.Store, Facts: manifest.Manifest{manifest.CPUFeatures: "sse2"}, Digest: digest,
		Draining: func() bool { return true }, ImageParks: func() bool { return false }}
	o, err := p.Offer(t.Context(), []string{"have", "lack"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Facts[manifest.CPUFeatures] != "sse2" || o.Facts[manifest.Protocol] == "" || len(o.Images) != 1 || o.Images["have"] != "sha256:1" ||
		!o.Draining || o.ImageParks || o.Free == 0 {
		t.Fatalf("offer %+v", o)
	}
	p.MinFree = 1 << 62
	if o, err := p.Offer(t.Context(), nil); err != nil || o.Free != 0 {
		t.Fatalf("offer with all the room kept: %+v %v", o, err)
	}
}

// The room a host offers leaves out what it owes post-copy migrations
// already (Local.Reserved): owed more than it has, it offers none. Seen
// failing first: the whole filesystem's room offered.
func TestOfferLeavesOutReserved(t *testing.T) {
	h := testhost.New(t, "")
	p := Local{Store: h.Store, MinFree: 1, Facts: manifest.Manifest{}, Digest: func(context.Context, string) (string, error) { return "", errors.New("none") },
		Draining: func() bool { return false }, ImageParks: func() bool { return true }}
	o, err := p.Offer(t.Context(), nil)
	if err != nil || o.Free == 0 {
		t.Fatalf("offer %+v: %v", o, err)
	}
	p.Reserved = func() (uint64, error) { return 1 << 62, nil }
	if o, err = p.Offer(t.Context(), nil); err != nil || o.Free != 0 {
		t.Fatalf("offered %d bytes owing 2^62: %v", o.Free, err)
	}
}
