package daemon

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/pkg/attest"
)

// An interval journals a name's first answer and each change of its
// addresses, not an answer the same as the name's last (in any order),
// and at most MaxResolutions entries: past them an answer that needs
// one is refused, one that needs none still goes.
func TestResolutionEntry(t *testing.T) {
	a := netip.MustParseAddr("203.0.113.10")
	b := netip.MustParseAddr("203.0.113.11")
	res := func(name string, addrs ...netip.Addr) egress.Resolution {
		return egress.Resolution{Name: name, Addrs: addrs, TTL: 300 * time.Second}
	}
	var es []attest.Entry
	add := func(r egress.Resolution) bool {
		t.Helper()
		e, err := resolutionEntry(es, r, 1)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if e != nil {
			es = append(es, *e)
		}
		return e != nil
	}
	for i, c := range []struct {
		r    egress.Resolution
		want bool
	}{
		{res("pypi.org", a, b), true},
		{res("pypi.org", b, a), false},
		{res("files.pythonhosted.org", a, b), true},
		{res("pypi.org", a), true},
		{res("pypi.org", a, b), true},
		{res("pypi.org"), true},
		{res("pypi.org"), false},
	} {
		if got := add(c.r); got != c.want {
			t.Errorf("answer %d %+v: journaled %v, want %v", i, c.r, got, c.want)
		}
	}
	r, err := attest.DecodeResolution(es[0].Data)
	if err != nil || r.Name != "pypi.org" || r.TTLSec != 300 || len(r.Addrs) != 2 || es[0].Kind != attest.ResolutionKind {
		t.Fatalf("the first entry: %+v, %v", r, err)
	}
	for len(es) < MaxResolutions {
		es = append(es, attest.Entry{Kind: attest.ResolutionKind, Data: es[1].Data})
	}
	if _, err := resolutionEntry(es, res("example.org", a), 1); !errors.Is(err, errTooMany) {
		t.Fatalf("an entry past the bound: %v, want errTooMany", err)
	}
	if e, err := resolutionEntry(es, res("files.pythonhosted.org", b, a), 1); e != nil || err != nil {
		t.Fatalf("a renewal past the bound: %v, %v", e, err)
	}
}
