package server

import (
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// GET /v1/host lists the runs held here for post-copy targets, each with
// its target, head, start and end: what an operator reads to see what a
// source still serves and pins. Seen failing first: none listed.
func TestHostListsHolds(t *testing.T) {
	since := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	target, head := record.Sum([]byte("target")), record.Sum([]byte("head"))
	h := hostOf(answers.HostInfo{Holds: []answers.Hold{{Run: "r", Target: target, Head: head, Since: since, Ends: since.Add(time.Hour)}}})
	want := []api.PostCopyHold{{Run: "r", Target: target.String(), Head: head.String(), Since: since, Ends: since.Add(time.Hour)}}
	if len(h.PostCopyHolds) != 1 || h.PostCopyHolds[0] != want[0] {
		t.Fatalf("holds %+v, want %+v", h.PostCopyHolds, want)
	}
}

// GET /v1/host lists the runs that owe this host slabs, each with its
// source, head, slabs owed, and its fetch's state and reason (the time
// of the last try only when one failed).
func TestHostListsOwings(t *testing.T) {
	tried := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	source, head := record.Sum([]byte("source")), record.Sum([]byte("head"))
	h := hostOf(answers.HostInfo{Owings: []answers.Owing{
		{Run: "w", Source: source, Head: head, Slabs: 2, State: "waiting", Reason: "gone", Tried: tried},
		{Run: "f", Source: source, Head: head, Slabs: 1, State: "fetching"},
	}})
	if len(h.PostCopyOwings) != 2 {
		t.Fatalf("owings %+v, want 2", h.PostCopyOwings)
	}
	w, f := h.PostCopyOwings[0], h.PostCopyOwings[1]
	if w.Run != "w" || w.Source != source.String() || w.Head != head.String() || w.Slabs != 2 || w.State != "waiting" || w.Reason != "gone" || w.Tried == nil || !w.Tried.Equal(tried) {
		t.Fatalf("waiting owing %+v", w)
	}
	if f.Run != "f" || f.State != "fetching" || f.Reason != "" || f.Tried != nil {
		t.Fatalf("fetching owing %+v", f)
	}
}

// GET /v1/runs/{id}/verify of a run owing slabs says where their fetch
// is (its owing, as GET /v1/host lists it); of one owing none, nothing.
func TestVerifyShowsOwing(t *testing.T) {
	source, head := record.Sum([]byte("source")), record.Sum([]byte("head"))
	v := verifyOf(answers.Verification{Run: "r", Owed: 2, Owing: &answers.Owing{Run: "r", Source: source, Head: head, Slabs: 2, State: "waiting", Reason: "gone", Tried: time.Now()}})
	if o := v.Owing; v.Owed != 2 || o == nil || o.Source != source.String() || o.State != "waiting" || o.Reason != "gone" || o.Tried == nil {
		t.Fatalf("verify of an owing run: %+v, owing %+v", v, v.Owing)
	}
	if v := verifyOf(answers.Verification{Run: "r"}); v.Owing != nil || v.Owed != 0 {
		t.Fatalf("verify of a run owing nothing: %+v", v)
	}
}
