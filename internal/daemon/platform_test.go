package daemon

import (
	"testing"

	"github.com/runrecordd/runrecordd/internal/answers"
)

// StoredBytes counts every object a run's record reaches, its park's
// images included, and an object two runs reach once.
func TestStoredBytes(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	started, err := h.d.Run("r")
	if err != nil {
		t.Fatal(err)
	}
	before, err := h.d.StoredBytes([]answers.Summary{started})
	if err != nil || before <= 0 {
		t.Fatalf("a started run: %d bytes, %v", before, err)
	}
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	parked, err := h.d.Run("r")
	if err != nil {
		t.Fatal(err)
	}
	after, err := h.d.StoredBytes([]answers.Summary{parked})
	if err != nil || after <= before {
		t.Fatalf("parked: %d bytes (started: %d), %v", after, before, err)
	}
	if twice, err := h.d.StoredBytes([]answers.Summary{parked, parked}); err != nil || twice != after {
		t.Fatalf("the same run twice: %d bytes, want %d (%v)", twice, after, err)
	}
	if _, err := h.d.StoredBytes([]answers.Summary{{ID: "none"}}); err == nil {
		t.Fatal("a run the store lacks was counted")
	}
}
