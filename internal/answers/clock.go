package answers

import "time"

// Clock times an operation's steps for its reply.
type Clock struct {
	start, last time.Time
	// Steps are the steps marked so far, in order.
	Steps []Step
}

// NewClock starts timing an operation.
func NewClock() *Clock {
	now := time.Now()
	return &Clock{start: now, last: now}
}

// Mark ends the step called name (on a nil clock, nothing).
func (c *Clock) Mark(name string) {
	if c == nil {
		return
	}
	now := time.Now()
	c.Steps = append(c.Steps, Step{Name: name, Took: now.Sub(c.last)})
	c.last = now
}

// Total is the time since the operation began.
func (c *Clock) Total() time.Duration { return time.Since(c.start) }
