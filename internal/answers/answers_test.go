package answers

import (
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A run's status: closed first, then handed off (a copy when it came in
// one), then parked in its form, then running here, else lost.
func TestStatusOf(t *testing.T) {
	tr := record.TranscriptSnapshot(record.Sum([]byte("transcript")))
	for _, c := range []struct {
		name                 string
		run                  store.Run
		off, isCopy, running bool
		want                 Status
	}{
		{"closed, even handed off", store.Run{Phase: record.PhaseClosed}, true, false, false, Closed},
		{"a copy", store.Run{Phase: record.PhaseParked}, true, true, false, Copy},
		{"handed off", store.Run{Phase: record.PhaseParked}, true, false, false, HandedOff},
		{"parked (transcript)", store.Run{Phase: record.PhaseParked, Parked: tr}, false, false, false, ParkedTranscript},
		{"parked (image)", store.Run{Phase: record.PhaseParked, Parked: record.Snapshot{}}, false, false, false, ParkedImage},
		{"running here", store.Run{Phase: record.PhaseExecuting}, false, false, true, Running},
		{"lost", store.Run{Phase: record.PhaseExecuting}, false, false, false, Lost},
	} {
		if got := statusOf(c.run, c.off, c.isCopy, c.running); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	if Status(99).String() != "unknown" || ParkedTranscript.String() != "parked (transcript)" {
		t.Fatal("status names")
	}
}

// The clock's steps follow one another; a nil clock marks nothing.
func TestClock(t *testing.T) {
	c := NewClock()
	c.Mark("a")
	c.Mark("b")
	if len(c.Steps) != 2 || c.Steps[0].Name != "a" || c.Steps[1].Name != "b" || c.Total() < c.Steps[0].Took+c.Steps[1].Took {
		t.Fatalf("steps %+v, total %v", c.Steps, c.Total())
	}
	var none *Clock
	none.Mark("c")
}
