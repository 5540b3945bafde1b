package daemon

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// fakeBooking books into a log that the event reader writes too.
type fakeBooking struct {
	mu      sync.Mutex
	log     []string
	bookErr error
}

func (b *fakeBooking) note(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, s)
}

func (b *fakeBooking) Book(run string) error {
	b.note("book " + run)
	return b.bookErr
}

func (b *fakeBooking) Unbook(run string) error {
	b.note("unbook " + run)
	return nil
}

func (b *fakeBooking) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.log, "; ")
}

// A booked start books the run before its run.started is published, so
// that whoever the booking names is told of it; a start refused by its
// booking starts nothing, and one refused after its booking is unbooked.
func TestStartBooked(t *testing.T) {
	h := newFakeHost(t)
	spec := unit.Spec{Image: fakeImage, Args: []string{"/unit"}}
	ch, done := h.d.events.Subscribe()
	defer done()
	b := &fakeBooking{}
	if _, err := h.d.StartBooked(t.Context(), "r", spec, unit.Grants{}, answers.Starting{Booking: b}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-ch:
		b.note("event " + e.Kind + " " + e.Run)
	case <-time.After(10 * time.Second):
		t.Fatal("no run.started")
	}
	if got, want := b.String(), "book r; event run.started r"; got != want {
		t.Fatalf("%s, want %s", got, want)
	}

	refused := &fakeBooking{bookErr: errors.New("books full")}
	if _, err := h.d.StartBooked(t.Context(), "s", spec, unit.Grants{}, answers.Starting{Booking: refused}); !errors.Is(err, refused.bookErr) {
		t.Fatalf("a start its booking refused: %v", err)
	}
	if _, err := h.d.st.Run("s"); !errors.Is(err, store.ErrNoRun) || h.ex.sandbox("s") != nil {
		t.Fatalf("a start its booking refused left a run (%v) or a sandbox", err)
	}

	h.ex.mu.Lock()
	h.ex.startErr = errors.New("no sandbox")
	h.ex.mu.Unlock()
	late := &fakeBooking{}
	if _, err := h.d.StartBooked(t.Context(), "u", spec, unit.Grants{}, answers.Starting{Booking: late}); !errors.Is(err, h.ex.startErr) {
		t.Fatalf("a start its sandbox refused: %v", err)
	}
	if got, want := late.String(), "book u; unbook u"; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
	// A run that exists is never booked again.
	again := &fakeBooking{}
	if _, err := h.d.StartBooked(t.Context(), "r", spec, unit.Grants{}, answers.Starting{Booking: again}); !errors.Is(err, store.ErrRunExists) || again.String() != "" {
		t.Fatalf("a start of a run that exists: %v, booking %q", err, again)
	}
}
