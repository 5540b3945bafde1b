package forms

import (
	"testing"

	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// TestImageSpecRange: where the host runs image units in user
// namespaces, a run's sandboxes map to the range it holds, taken at the
// first; two runs hold two ranges; without ranges, no user namespace.
func TestImageSpecRange(t *testing.T) {
	run := Run{ID: "run-a", Spec: unit.Spec{Image: "img"}}
	es, err := Env{}.imageSpec(run)
	if err != nil || es.UserNS != nil {
		t.Fatalf("without ranges: %+v, %v", es.UserNS, err)
	}
	rs, err := idmap.Open(t.TempDir(), idmap.Config{Count: 2, Subordinate: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	h := Env{Ranges: rs}
	a, err := h.imageSpec(run)
	if err != nil || a.UserNS == nil {
		t.Fatalf("with ranges: %+v, %v", a.UserNS, err)
	}
	again, _ := h.imageSpec(run)
	if *again.UserNS != *a.UserNS {
		t.Fatalf("run-a's second sandbox maps to %d, its first to %d", again.UserNS.Base, a.UserNS.Base)
	}
	b, err := h.imageSpec(Run{ID: "run-b", Spec: unit.Spec{Image: "img"}})
	if err != nil || *b.UserNS == *a.UserNS {
		t.Fatalf("run-b: %+v, %v", b.UserNS, err)
	}
	if _, err := h.imageSpec(Run{ID: "run-c", Spec: unit.Spec{Image: "img"}}); err == nil {
		t.Fatal("a third run in a window of two ranges")
	}
}
