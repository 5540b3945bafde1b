package fleet

import (
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// TestReconcile pins docs/fleet.md's table "Reconciling at start".
func TestReconcile(t *testing.T) {
	self, other := key("self"), key("other")
	g, h1, h2, h9 := key("g"), key("h1"), key("h2"), key("h9")
	at := func(h record.Address, p record.Phase) *Local { return &Local{Head: h, Phase: p} }
	entry := func(owner, head record.Address, p record.Phase) *Entry {
		return &Entry{Genesis: g, Owner: owner, Lease: 1, Head: head, Phase: p}
	}
	reserved := func(owner record.Address) *Entry {
		e := entry(owner, h2, record.PhaseExecuting)
		e.Prev, e.PrevPhase = h1, record.PhaseParked
		return e
	}
	to := func(e *Entry, host record.Address) *Entry { e.To = host; return e }
	for _, tc := range []struct {
		name  string
		local *Local
		e     *Entry
		want  Action
	}{
		{"neither", nil, nil, Keep},
		{"another host's run", nil, entry(other, h1, record.PhaseParked), Keep},
		{"owned at its head", at(h1, record.PhaseParked), entry(self, h1, record.PhaseParked), Reclaim},
		{"reservation not appended", at(h1, record.PhaseParked), reserved(self), Reclaim},
		{"reservation appended", at(h2, record.PhaseExecuting), reserved(self), Reclaim},
		{"no entry", at(h1, record.PhaseParked), nil, Register},
		{"adopted by another host", at(h1, record.PhaseParked), entry(other, h1, record.PhaseParked), Elsewhere},
		{"another host's reservation", at(h1, record.PhaseParked), reserved(other), Elsewhere},
		{"transferred away", at(h1, record.PhaseParked), to(entry(self, h1, record.PhaseParked), other), Elsewhere},
		{"transferred here", at(h1, record.PhaseParked), to(entry(other, h1, record.PhaseParked), self), Reclaim},
		{"transferred here, other head", at(h9, record.PhaseParked), to(entry(other, h1, record.PhaseParked), self), Diverged},
		{"leftover claim", nil, entry(self, g, record.PhaseExecuting), Leftover},
		{"owned run the store lost", nil, entry(self, h1, record.PhaseParked), Diverged},
		{"owned at another head", at(h9, record.PhaseParked), reserved(self), Diverged},
		{"same head, other phase", at(h1, record.PhaseExecuting), entry(self, h1, record.PhaseParked), Diverged},
		{"closed here", at(h9, record.PhaseClosed), entry(other, h1, record.PhaseParked), Keep},
	} {
		if got := Reconcile(self, tc.local, tc.e); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
