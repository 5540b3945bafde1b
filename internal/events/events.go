// Package events fans the daemon's transitions out to watchers
// (GET /v1/events).
package events

import (
	"sync"
	"time"
)

// Event is one transition: a run started, parked, resumed or closed, a
// call dispatched or a result posted (pkg/api.Event lists the kinds).
type Event struct {
	Time     time.Time
	Kind     string
	Run      string
	Call     string
	CallKind string
	Detail   string
}

// Hub fans transitions out to watchers. A watcher that falls behind loses
// events rather than holding up the daemon; its channel says so by
// receiving an event of kind "events.dropped". The zero value is ready.
type Hub struct {
	mu      sync.Mutex
	subs    map[chan Event]bool
	stopped bool
}

// Stop ends every event stream (their channels close) and any subscribed
// later: an HTTP server shutting down calls it, since a stream never ends
// by itself.
func (h *Hub) Stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	h.stopped = true
	for ch := range h.subs {
		close(ch)
	}
	h.subs = nil
}

// Publish sends e to every watcher, stamped now if it has no time.
func (h *Hub) Publish(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- e:
		default:
			select {
			case <-ch: // make room for the notice
			default:
			}
			select {
			case ch <- Event{Time: e.Time, Kind: "events.dropped", Run: e.Run}:
			default:
			}
		}
	}
}

// Subscribe returns a channel of transitions from now on and a function
// that ends the subscription.
func (h *Hub) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event, 256)
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		close(ch)
		return ch, func() {}
	}
	if h.subs == nil {
		h.subs = map[chan Event]bool{}
	}
	h.subs[ch] = true
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		if h.subs[ch] {
			delete(h.subs, ch)
			close(ch)
		}
		h.mu.Unlock()
	}
}
