package events

import (
	"testing"
)

func eventFor(run string) Event { return Event{Kind: "run.started", Run: run} }

// Stop ends every stream, and any opened afterwards.
func TestStop(t *testing.T) {
	var h Hub
	a, doneA := h.Subscribe()
	defer doneA()
	h.Publish(eventFor("x"))
	if e := <-a; e.Run != "x" || e.Time.IsZero() {
		t.Fatalf("got %+v", e)
	}
	h.Stop()
	if _, ok := <-a; ok {
		t.Fatal("a stream outlived Stop")
	}
	b, doneB := h.Subscribe()
	defer doneB()
	if _, ok := <-b; ok {
		t.Fatal("a stream opened after Stop is open")
	}
	h.Publish(eventFor("y")) // no panic on closed streams
}

// A watcher that falls behind loses events, never holds up the publisher,
// and is told so: the newest entry of its full channel is the notice.
func TestSlowWatcherIsToldItDropped(t *testing.T) {
	var h Hub
	ch, done := h.Subscribe()
	defer done()
	for range cap(ch) + 10 {
		h.Publish(eventFor("r"))
	}
	var last Event
	for range len(ch) {
		last = <-ch
	}
	if last.Kind != "events.dropped" || last.Run != "r" {
		t.Fatalf("last event %+v, want the drop notice", last)
	}
}
