package unit

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func egressGrants(allow ...Dest) Grants {
	return Grants{Network: Egress, Egress: allow}
}

func TestEgressRoundTrip(t *testing.T) {
	for _, g := range []Grants{
		egressGrants(Dest{CIDR: "203.0.113.0/24", Proto: "tcp", Ports: "443"}),
		egressGrants(
			Dest{CIDR: "10.0.0.0/8", Proto: "udp", Ports: "53"},
			Dest{Name: "pypi.org", Proto: "tcp", Ports: "80-443"},
		),
		{MilliCPU: 250, Network: Egress, Egress: []Dest{{Name: "files.example", Proto: "tcp", Ports: "1-65535"}},
			Limits: Limits{Pids: 64}, ReadOnly: []Mount{{"/srv", "/srv"}}},
	} {
		b, err := g.Canonical()
		if err != nil {
			t.Fatalf("%+v: %v", g, err)
		}
		back, err := DecodeGrants(b)
		if err != nil {
			t.Fatalf("%+v: decode: %v", g, err)
		}
		again, err := back.Canonical()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("%+v: re-encodes to %x (%v), want %x", g, again, err, b)
		}
		j, err := json.Marshal(back)
		if err != nil {
			t.Fatal(err)
		}
		var fromJSON Grants
		if err := json.Unmarshal(j, &fromJSON); err != nil {
			t.Fatalf("%s: %v", j, err)
		}
		if c, err := fromJSON.Canonical(); err != nil || !bytes.Equal(c, b) {
			t.Fatalf("through JSON %s: %x (%v), want %x", j, c, err, b)
		}
	}
}

// The bytes of none and loopback grant sets do not change with egress:
// their grants_ids stay what they were.
func TestEgressLeavesOldBytes(t *testing.T) {
	g := Grants{MilliCPU: 500, Network: Loopback, ReadOnly: []Mount{{"/srv/data", "/data"}}}
	id, err := g.ID()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := id.String(), "b3:-nW8XJSuZ9dmlpRGEs3B4kG9fFnjTIQ8fXmk7JSuF2I"; got != want {
		t.Fatalf("grants_id %s, want %s (docs/unit.md)", got, want)
	}
}

func TestEgressRefused(t *testing.T) {
	for name, g := range map[string]Grants{
		"egress without a list":  {Network: Egress},
		"a list without egress":  {Network: Loopback, Egress: []Dest{{CIDR: "10.0.0.0/8", Proto: "tcp", Ports: "1"}}},
		"IPv6":                   egressGrants(Dest{CIDR: "2001:db8::/32", Proto: "tcp", Ports: "443"}),
		"host bits set":          egressGrants(Dest{CIDR: "10.1.2.3/8", Proto: "tcp", Ports: "443"}),
		"no prefix":              egressGrants(Dest{CIDR: "10.1.2.3", Proto: "tcp", Ports: "443"}),
		"both cidr and name":     egressGrants(Dest{CIDR: "10.0.0.0/8", Name: "a.example", Proto: "tcp", Ports: "443"}),
		"neither":                egressGrants(Dest{Proto: "tcp", Ports: "443"}),
		"bad name":               egressGrants(Dest{Name: "a..example", Proto: "tcp", Ports: "443"}),
		"upper-case name":        egressGrants(Dest{Name: "PyPI.org", Proto: "tcp", Ports: "443"}),
		"trailing dot":           egressGrants(Dest{Name: "pypi.org.", Proto: "tcp", Ports: "443"}),
		"an address as a name":   egressGrants(Dest{Name: "10.0.0.1", Proto: "tcp", Ports: "443"}),
		"port 0":                 egressGrants(Dest{CIDR: "10.0.0.0/8", Proto: "tcp", Ports: "0"}),
		"ports reversed":         egressGrants(Dest{CIDR: "10.0.0.0/8", Proto: "tcp", Ports: "443-80"}),
		"port too large":         egressGrants(Dest{CIDR: "10.0.0.0/8", Proto: "tcp", Ports: "65536"}),
		"no ports":               egressGrants(Dest{CIDR: "10.0.0.0/8", Proto: "tcp"}),
		"icmp":                   egressGrants(Dest{CIDR: "10.0.0.0/8", Proto: "icmp", Ports: "1"}),
		"unsorted":               egressGrants(Dest{Name: "b.example", Proto: "tcp", Ports: "1"}, Dest{Name: "a.example", Proto: "tcp", Ports: "1"}),
		"duplicate":              egressGrants(Dest{Name: "a.example", Proto: "tcp", Ports: "1"}, Dest{Name: "a.example", Proto: "tcp", Ports: "1"}),
		"leading zero in a port": egressGrants(Dest{CIDR: "10.0.0.0/8", Proto: "tcp", Ports: "0443"}),
	} {
		if _, err := g.Canonical(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	many := make([]Dest, MaxEgressDests+1)
	for i := range many {
		many[i] = Dest{CIDR: "10.0.0.0/8", Proto: "tcp", Ports: portString(uint16(i+1), uint16(i+1))}
	}
	SortDests(many)
	if g := egressGrants(many...); !errors.Is(g.Validate(), ErrInvalid) {
		t.Errorf("%d destinations: %v, want ErrInvalid", len(many), g.Validate())
	}
}

// SortDests puts a list in its one canonical order, and a decoder refuses
// every other order and any byte that is not what an encoder writes.
func TestEgressDecodeRefuses(t *testing.T) {
	g := egressGrants(Dest{Name: "a.example", Proto: "tcp", Ports: "443"}, Dest{CIDR: "192.0.2.0/24", Proto: "udp", Ports: "53"})
	SortDests(g.Egress)
	b, err := g.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeGrants(b); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func([]byte) []byte{
		"truncated":      func(b []byte) []byte { return b[:len(b)-1] },
		"trailing byte":  func(b []byte) []byte { return append(b, 0) },
		"unknown tag":    func(b []byte) []byte { c := bytes.Clone(b); c[len(GrantsDomain)+13+4] = 0x07; return c },
		"kind 3":         func(b []byte) []byte { c := bytes.Clone(b); c[len(GrantsDomain)+13+4+1+4] = 3; return c },
		"count too big":  func(b []byte) []byte { c := bytes.Clone(b); c[len(GrantsDomain)+13+4+1+3] = 9; return c },
		"network loopbk": func(b []byte) []byte { c := bytes.Clone(b); c[len(GrantsDomain)+12] = byte(Loopback); return c },
	} {
		if _, err := DecodeGrants(mut(b)); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func TestParseDest(t *testing.T) {
	for in, want := range map[string]Dest{
		"203.0.113.0/24:443":    {CIDR: "203.0.113.0/24", Proto: "tcp", Ports: "443"},
		"pypi.org:443":          {Name: "pypi.org", Proto: "tcp", Ports: "443"},
		"10.0.0.0/8:53/udp":     {CIDR: "10.0.0.0/8", Proto: "udp", Ports: "53"},
		"files.example:1-65535": {Name: "files.example", Proto: "tcp", Ports: "1-65535"},
		"192.0.2.7/32:8080/tcp": {CIDR: "192.0.2.7/32", Proto: "tcp", Ports: "8080"},
	} {
		got, err := ParseDest(in)
		if err != nil || got != want {
			t.Errorf("%s: %+v %v, want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "pypi.org", "[2001:db8::1]:443", "10.0.0.1:443", "a:b:c", "x.example:443/sctp"} {
		if d, err := ParseDest(in); err == nil {
			t.Errorf("%s: parsed as %+v", in, d)
		}
	}
}
