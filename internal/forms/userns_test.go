package forms

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// TestUnitSpecRange: where the host runs units in user namespaces, a
// run's sandboxes map to the range it holds, taken at the first; two runs
// hold two ranges; without ranges, or for a unit that runs as the host's
// root, no user namespace.
func TestUnitSpecRange(t *testing.T) {
	run := Run{ID: "run-a", Spec: unit.Spec{Image: "img"}}
	es, err := Env{}.unitSpec(run, true, false)
	if err != nil || es.UserNS != nil {
		t.Fatalf("without ranges: %+v, %v", es.UserNS, err)
	}
	rs, err := idmap.Open(t.TempDir(), idmap.Config{Count: 2, Subordinate: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	h := Env{Ranges: rs}
	if es, err := h.unitSpec(run, false, false); err != nil || es.UserNS != nil {
		t.Fatalf("as the host's root: %+v, %v", es.UserNS, err)
	}
	a, err := h.unitSpec(run, true, false)
	if err != nil || a.UserNS == nil {
		t.Fatalf("with ranges: %+v, %v", a.UserNS, err)
	}
	again, _ := h.unitSpec(run, true, false)
	if *again.UserNS != *a.UserNS {
		t.Fatalf("run-a's second sandbox maps to %d, its first to %d", again.UserNS.Base, a.UserNS.Base)
	}
	b, err := h.unitSpec(Run{ID: "run-b", Spec: unit.Spec{Image: "img"}}, true, false)
	if err != nil || *b.UserNS == *a.UserNS {
		t.Fatalf("run-b: %+v, %v", b.UserNS, err)
	}
	if _, err := h.unitSpec(Run{ID: "run-c", Spec: unit.Spec{Image: "img"}}, true, false); err == nil {
		t.Fatal("a third run in a window of two ranges")
	}
}

// TestTranscriptSpecRange: a transcript unit's sandbox, and a warm one
// made for its run, map to the range the run holds, with no probe; its
// channel is mounted.
func TestTranscriptSpecRange(t *testing.T) {
	rs, err := idmap.Open(t.TempDir(), idmap.Config{Count: 2, Subordinate: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	h := Env{Ranges: rs}
	run := Run{ID: "run-t", Spec: unit.Spec{Image: "img", Mode: unit.TranscriptMode}}
	es, err := h.sandboxSpec(run, "/state/ch/run-t")
	if err != nil || es.UserNS == nil {
		t.Fatalf("%+v, %v", es.UserNS, err)
	}
	if r, ok := rs.Held(run.ID); !ok || r != *es.UserNS {
		t.Fatalf("the run holds %+v (%v), its sandbox maps %+v", r, ok, *es.UserNS)
	}
	if n := len(es.Mounts); n != 1 || !es.Mounts[0].Own {
		t.Fatalf("mounts %+v", es.Mounts)
	}
}

// TestResumeUserNS: a park made in a user namespace resumes in one; one
// made without resumes without only where the host accepts host-root
// image units, and otherwise in one (for the judge to refuse).
func TestResumeUserNS(t *testing.T) {
	with, without := t.TempDir(), t.TempDir()
	for _, f := range []string{"core-1.img", "userns-11.img"} {
		if err := os.WriteFile(filepath.Join(with, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(without, "core-1.img"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir      string
		hostRoot bool
		want     bool
	}{{with, false, true}, {with, true, true}, {without, false, true}, {without, true, false}} {
		if got := (Env{HostRootImages: c.hostRoot}).resumeUserNS(c.dir); got != c.want {
			t.Errorf("images with a user namespace %v, host-root accepted %v: %v, want %v", c.dir == with, c.hostRoot, got, c.want)
		}
	}
}
