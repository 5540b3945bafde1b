package daemon

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A start whose egress grant this host does not give is refused before
// anything is made: no ceiling, beyond it, by name, a transcript unit, and
// a host that links nothing out.
func TestStartEgressRefused(t *testing.T) {
	grants := func(ds ...unit.Dest) unit.Grants { return unit.Grants{Network: unit.Egress, Egress: ds} }
	world := unit.Dest{CIDR: "203.0.113.0/24", Proto: "tcp", Ports: "443"}
	pypi := unit.Dest{Name: "pypi.org", Proto: "tcp", Ports: "443"}
	all := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	image := unit.Spec{Image: fakeImage, Args: []string{"/unit"}}
	for _, c := range []struct {
		name    string
		ceiling []netip.Prefix
		names   bool // the host has an upstream resolver
		spec    unit.Spec
		grants  unit.Grants
		want    error
	}{
		{"no ceiling", nil, false, image, grants(world), bundle.ErrPolicy},
		{"beyond", []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, false, image, grants(world), bundle.ErrPolicy},
		{"by name, no resolver", all, false, image, grants(world, pypi), bundle.ErrPolicy},
		// Past the judge of its grant, to the links this fake host has not.
		{"by name, a resolver", all, true, image, grants(world, pypi), forms.ErrNoEgress},
		{"transcript", []netip.Prefix{netip.MustParsePrefix("203.0.0.0/8")}, false, unit.Spec{Image: fakeImage, Mode: unit.TranscriptMode}, grants(world), answers.ErrInvalid},
		{"no links", []netip.Prefix{netip.MustParsePrefix("203.0.0.0/8")}, false, image, grants(world), forms.ErrNoEgress},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newFakeHost(t, func(d *Daemon) {
				d.cfg.EgressAllow = c.ceiling
				if c.names {
					d.cfg.EgressResolver = netip.MustParseAddrPort("192.0.2.53:53")
				}
			})
			_, err := h.d.Start(t.Context(), "r", c.spec, c.grants)
			if !errors.Is(err, c.want) {
				t.Fatalf("start: %v, want %v", err, c.want)
			}
			if h.ex.starts != 0 {
				t.Fatalf("%d sandboxes started", h.ex.starts)
			}
			if _, err := h.d.st.Run("r"); err == nil {
				t.Fatal("the refused start has a run")
			}
		})
	}
	// Within the ceiling, the loopback and none grants are as before.
	h := newFakeHost(t)
	if _, err := h.d.Start(t.Context(), "lo", image, unit.Grants{Network: unit.Loopback}); err != nil {
		t.Fatal(err)
	}
}

// A link is judged against the ceiling now, whatever admitted the run: a
// run granted more under a wider ceiling (a restart since, or a run that
// came back, whose import does not judge its grants again) is refused
// its link beyond it, before a slot is taken.
func TestLinkWithinCeiling(t *testing.T) {
	l := &links{ceiling: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, slot: map[string]int{}, runs: map[string]*egress.Run{}}
	_, err := l.Link("r", []unit.Dest{{CIDR: "0.0.0.0/0", Proto: "tcp", Ports: "1-65535"}})
	if !errors.Is(err, bundle.ErrPolicy) || len(l.slot) != 0 {
		t.Fatalf("a link beyond the ceiling: %v; slots %v", err, l.slot)
	}
}
