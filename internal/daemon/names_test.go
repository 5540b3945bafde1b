package daemon

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
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

// resolutions are the resolution entries among es.
func resolutions(t *testing.T, es []attest.Entry) []attest.Resolution {
	t.Helper()
	var out []attest.Resolution
	for _, e := range es {
		if e.Kind == attest.ResolutionKind {
			r, err := attest.DecodeResolution(e.Data)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
	}
	return out
}

// An answer for the run holding a slot is journaled in its open interval
// under its lock, with the interval's mark saved (a restarted daemon goes
// on with it), and sealed with the interval at its park; an equal answer
// adds nothing. A slot no run holds, a run whose lock an operation keeps,
// and a parked run are refused (the unit gets SERVFAIL, nothing allowed).
func TestResolvedJournals(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	h.d.links = &links{slot: map[string]int{"r": 3}, runs: map[string]*egress.Run{}}
	defer func() { h.d.links = nil }()
	res := egress.Resolution{Name: "pypi.org", Addrs: []netip.Addr{netip.MustParseAddr("203.0.113.10")}, TTL: 60 * time.Second}
	for range 2 {
		if err := h.d.links.resolved(h.d, 3, res); err != nil {
			t.Fatal(err)
		}
	}
	m, ok := interval.LoadMark(h.d.intervals.MarkPath("r"))
	if got := resolutions(t, m.Events); !ok || len(got) != 1 || got[0].Name != "pypi.org" || got[0].TTLSec != 60 {
		t.Fatalf("the saved mark's resolutions: %+v (a mark: %v), want the one", got, ok)
	}
	if err := h.d.links.resolved(h.d, 4, res); !errors.Is(err, errNoInterval) {
		t.Fatalf("a slot no run holds: %v, want errNoInterval", err)
	}
	other := egress.Resolution{Name: "files.pythonhosted.org", TTL: time.Minute}
	r := h.d.runs.peek("r")
	r.mu.Lock()
	err := h.d.links.resolved(h.d, 3, other)
	r.mu.Unlock()
	if err == nil {
		t.Fatal("an answer journaled while an operation held the run")
	}
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	if err := h.d.links.resolved(h.d, 3, other); !errors.Is(err, errNoInterval) {
		t.Fatalf("a parked run: %v, want errNoInterval", err)
	}
	raw, err := h.d.st.Raw("r")
	if err != nil {
		t.Fatal(err)
	}
	for _, seg := range raw.Segments {
		if seg.Kind != record.Executed {
			continue
		}
		_, j := h.journalOf(t, seg.Attestation)
		if got := resolutions(t, j.Entries); len(got) != 1 || got[0].Name != "pypi.org" {
			t.Fatalf("the sealed journal's resolutions: %+v, want the one", got)
		}
	}
}
