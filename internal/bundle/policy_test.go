package bundle

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A bundle's grants may not ask for more than this host's caps: a limit
// as large as it likes would switch the host's limits off.
func TestPolicyCapsLimits(t *testing.T) {
	p := &Policy{MaxLimits: DefaultMaxLimits, MaxMemoryBytes: 8 << 30, MaxMilliCPU: 2000}
	for name, g := range map[string]unit.Grants{
		"snapshot quota off": {Limits: unit.Limits{SnapshotBytes: 1<<64 - 1}},
		"pids":               {Limits: unit.Limits{Pids: 1 << 30}},
		"memory":             {MemoryBytes: 1 << 40},
		"cpu":                {MilliCPU: 64000},
	} {
		if err := p.Check(g); !errors.Is(err, ErrPolicy) {
			t.Errorf("%s: %v, want ErrPolicy", name, err)
		}
	}
	if err := p.Check(unit.Grants{MemoryBytes: 1 << 30, MilliCPU: 1000, Limits: unit.Limits{Pids: 64, SnapshotBytes: 1 << 30}}); err != nil {
		t.Fatalf("grants within the caps: %v", err)
	}
}

func TestCheckEgress(t *testing.T) {
	g := unit.Grants{Network: unit.Egress, Egress: []unit.Dest{
		{CIDR: "203.0.113.0/24", Proto: "tcp", Ports: "443"},
	}}
	ceiling := []netip.Prefix{netip.MustParsePrefix("203.0.0.0/8")}
	if err := CheckEgress(g, ceiling, false); err != nil {
		t.Fatalf("within the ceiling: %v", err)
	}
	named := unit.Grants{Network: unit.Egress, Egress: append(g.Egress[:1:1], unit.Dest{Name: "pypi.org", Proto: "tcp", Ports: "443"})}
	if err := CheckEgress(named, ceiling, false); !errors.Is(err, ErrPolicy) || !strings.Contains(err.Error(), "--egress-resolver") {
		t.Fatalf("a destination by name, no resolver: %v, want ErrPolicy naming --egress-resolver", err)
	}
	if err := CheckEgress(named, ceiling, true); err != nil {
		t.Fatalf("a destination by name, a resolver: %v", err)
	}
	if err := CheckEgress(named, nil, true); !errors.Is(err, ErrPolicy) {
		t.Fatalf("a destination by name, a resolver, no ceiling: %v, want ErrPolicy", err)
	}
	if err := CheckEgress(g, nil, false); !errors.Is(err, ErrPolicy) {
		t.Fatalf("no ceiling: %v, want ErrPolicy", err)
	}
	for _, c := range []string{"203.0.113.0/25", "10.0.0.0/8"} {
		if err := CheckEgress(g, []netip.Prefix{netip.MustParsePrefix(c)}, true); !errors.Is(err, ErrPolicy) {
			t.Errorf("ceiling %s: %v, want ErrPolicy", c, err)
		}
	}
	if err := CheckEgress(unit.Grants{Network: unit.Loopback}, nil, false); err != nil {
		t.Fatalf("loopback: %v", err)
	}
	p := Policy{EgressAllow: ceiling}
	if err := p.Check(g); err != nil {
		t.Fatalf("Policy.Check: %v", err)
	}
	if err := p.Check(named); !errors.Is(err, ErrPolicy) {
		t.Fatalf("Policy.Check of a name without a resolver: %v", err)
	}
	p.EgressNames = true
	if err := p.Check(named); err != nil {
		t.Fatalf("Policy.Check of a name with a resolver: %v", err)
	}
	if err := (&Policy{}).Check(g); !errors.Is(err, ErrPolicy) {
		t.Fatalf("Policy.Check without a ceiling: %v", err)
	}
}
