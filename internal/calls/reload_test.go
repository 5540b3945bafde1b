package calls

import (
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Reload reads the ledger again, as Open read it, for a channel made ahead
// of its interval (a warm sandbox's); one that has handled anything, or
// is closed, refuses.
func TestReload(t *testing.T) {
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{}, nil)
	want := ch.Interval()
	if err := ch.Reload(); err != nil || ch.Interval() != want || ch.outstanding != 0 {
		t.Fatalf("reload of a fresh channel: %v, interval %d (want %d), outstanding %d", err, ch.Interval(), want, ch.outstanding)
	}
	if err := ch.Dispatch(t.Context(), protocol.Call{ID: "c1", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Reload(); !errors.Is(err, protocol.ErrParked) || ch.outstanding != 1 {
		t.Fatalf("reload after a dispatch: %v, outstanding %d", err, ch.outstanding)
	}
	ch.Close()
	if err := ch.Reload(); !errors.Is(err, protocol.ErrParked) {
		t.Fatalf("reload of a closed channel: %v", err)
	}
}
