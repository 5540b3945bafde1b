package evidence

import (
	"testing"

	"github.com/runrecordd/runrecordd/internal/testhost"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func reader(t *testing.T, admitted func(record.Address) bool) (Reader, *testhost.Host, record.Address) {
	h := testhost.New(t, "")
	self := record.Sum([]byte("this host"))
	keys := func() trust.Keys { return trust.Keys{Store: h.Store, Self: self, Log: testhost.Log(t)} }
	return New(h.Store, keys, admitted, func(id string) string { return "/out/" + id }), h, self
}

// A key is trusted when it is this host's, trusted here, or admitted to the
// host's fleet as a host; no other is. Untrusting takes it back.
func TestTrusted(t *testing.T) {
	member := record.Sum([]byte("a fleet host"))
	e, _, self := reader(t, func(k record.Address) bool { return k == member })
	other, stranger := record.Sum([]byte("another host")), record.Sum([]byte("a stranger"))
	if _, err := e.Trust(other.String(), "other"); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[record.Address]bool{self: true, member: true, other: true, stranger: false} {
		if e.Trusted(key) != want {
			t.Errorf("%s trusted: %v, want %v", key, !want, want)
		}
	}
	if err := e.Untrust(other.String()); err != nil || e.Trusted(other) {
		t.Fatalf("untrusted: %v, still trusted %v", err, e.Trusted(other))
	}
	alone, _, _ := reader(t, nil)
	if alone.Trusted(member) {
		t.Fatal("alone, a fleet's host is trusted")
	}
}

// A run's verification reports a record whose evidence fails in its
// result, not as a failed request; an unknown run is a failed request.
// Released says whether its snapshots were let go.
func TestVerifyAndReleased(t *testing.T) {
	e, h, _ := reader(t, nil)
	h.Start(t, "r")
	h.Park(t, "r", h.TranscriptPark(t, 10)) // its attestation is no attestation
	v, err := e.Verify(t.Context(), "r")
	if err != nil || v.Err == nil || v.Segments != 2 || v.Phase != record.Parked {
		t.Fatalf("verification %+v: %v", v, err)
	}
	if _, err := e.Verify(t.Context(), "nosuch"); err == nil {
		t.Fatal("an unknown run verified")
	}
	if e.Released("r") || e.Stdout("r") != "/out/r" {
		t.Fatalf("released %v, stdout %q", e.Released("r"), e.Stdout("r"))
	}
	h.Append(t, "r", record.Closure("done"))
	if err := h.Store.Release("r"); err != nil {
		t.Fatal(err)
	}
	if !e.Released("r") {
		t.Fatal("a released run's snapshots are not released")
	}
}
