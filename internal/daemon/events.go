package daemon

import "github.com/runrecordd/runrecordd/internal/events"

// StopEvents ends every event stream and any subscribed later
// (internal/events).
func (d *Daemon) StopEvents() { d.events.Stop() }

// Subscribe returns a channel of transitions from now on and a function
// that ends the subscription.
func (d *Daemon) Subscribe() (<-chan events.Event, func()) { return d.events.Subscribe() }

func (d *Daemon) publish(e events.Event) { d.events.Publish(e) }
