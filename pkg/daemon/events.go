package daemon

import (
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// events fans transitions out to watchers. A watcher that falls behind
// loses events rather than holding up the daemon; its channel says so by
// receiving an event of kind "events.dropped".
type events struct {
	mu      sync.Mutex
	subs    map[chan api.Event]bool
	stopped bool
}

// StopEvents ends every event stream (their channels close) and any
// subscribed later: an HTTP server shutting down calls it, since a stream
// never ends by itself.
func (d *Daemon) StopEvents() {
	d.events.mu.Lock()
	defer d.events.mu.Unlock()
	if d.events.stopped {
		return
	}
	d.events.stopped = true
	for ch := range d.events.subs {
		close(ch)
	}
	d.events.subs = nil
}

func (d *Daemon) publish(e api.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	d.events.mu.Lock()
	defer d.events.mu.Unlock()
	for ch := range d.events.subs {
		select {
		case ch <- e:
		default:
			select {
			case <-ch: // make room for the notice
			default:
			}
			select {
			case ch <- api.Event{Time: e.Time, Kind: "events.dropped", Run: e.Run}:
			default:
			}
		}
	}
}

// Subscribe returns a channel of transitions from now on and a function
// that ends the subscription.
func (d *Daemon) Subscribe() (<-chan api.Event, func()) {
	ch := make(chan api.Event, 256)
	d.events.mu.Lock()
	if d.events.stopped {
		d.events.mu.Unlock()
		close(ch)
		return ch, func() {}
	}
	if d.events.subs == nil {
		d.events.subs = map[chan api.Event]bool{}
	}
	d.events.subs[ch] = true
	d.events.mu.Unlock()
	return ch, func() {
		d.events.mu.Lock()
		if d.events.subs[ch] {
			delete(d.events.subs, ch)
			close(ch)
		}
		d.events.mu.Unlock()
	}
}
