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
		e := entry(owner, h2, record.Active)
		e.Prev, e.PrevPhase = h1, record.Parked
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
		{"another host's run", nil, entry(other, h1, record.Parked), Keep},
		{"owned at its head", at(h1, record.Parked), entry(self, h1, record.Parked), Reclaim},
		{"reservation not appended", at(h1, record.Parked), reserved(self), Reclaim},
		{"reservation appended", at(h2, record.Active), reserved(self), Reclaim},
		{"no entry", at(h1, record.Parked), nil, Register},
		{"adopted by another host", at(h1, record.Parked), entry(other, h1, record.Parked), Elsewhere},
		{"another host's reservation", at(h1, record.Parked), reserved(other), Elsewhere},
		{"transferred away", at(h1, record.Parked), to(entry(self, h1, record.Parked), other), Elsewhere},
		{"transferred here", at(h1, record.Parked), to(entry(other, h1, record.Parked), self), Reclaim},
		{"transferred here, other head", at(h9, record.Parked), to(entry(other, h1, record.Parked), self), Diverged},
		{"leftover claim", nil, entry(self, g, record.Active), Leftover},
		{"owned run the store lost", nil, entry(self, h1, record.Parked), Diverged},
		{"owned at another head", at(h9, record.Parked), reserved(self), Diverged},
		{"same head, other phase", at(h1, record.Active), entry(self, h1, record.Parked), Diverged},
		{"closed here", at(h9, record.Ended), entry(other, h1, record.Parked), Keep},
	} {
		if got := Reconcile(self, tc.local, tc.e); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
