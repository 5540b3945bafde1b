package daemon

import (
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// append appends segs to run id at its current head, in one transaction.
func (d *Daemon) append(id string, segs ...record.Segment) error {
	head, err := d.st.Head(id)
	if err != nil {
		return err
	}
	_, err = d.records().AppendAll(id, head, segs...)
	return d.fleetErr(err)
}

// phaseFor reports why a run in phase p cannot do what wants (nil when it
// can).
func phaseErr(id string, p record.Phase, want record.Phase) error {
	if p == want {
		return nil
	}
	switch p {
	case record.Ended:
		return fmt.Errorf("run %s: %w", id, record.ErrClosed)
	case record.Parked:
		return fmt.Errorf("run %s: %w", id, record.ErrParked)
	default:
		return fmt.Errorf("run %s: %w", id, record.ErrNotParked)
	}
}

// unitOf reads a run's unit spec and grant set from their objects.
func (d *Daemon) unitOf(st store.Run) (unit.Spec, unit.Grants, error) {
	r, err := forms.ReadRun(d.st, st)
	return r.Spec, r.Grants, err
}

// summary is run id as this host holds it; r is its state here, nil when
// it has none.
func (d *Daemon) summary(id string, r *run) (Summary, error) {
	st, err := d.st.Run(id)
	if err != nil {
		return Summary{}, err
	}
	out := Summary{ID: id, Phase: st.Phase, Segments: st.Len, Head: st.Head, Unit: st.Unit, Grants: st.Grants}
	if spec, _, err := d.unitOf(st); err == nil {
		out.Spec = &spec
	}
	held, off, err := d.st.HandedOff(id)
	out.HandedOff = err == nil && off
	if ret, err := d.st.RetentionOf(id); err == nil {
		out.Pinned, out.Released = ret.Pinned, !ret.Released.IsZero()
	}
	switch {
	case st.Phase == record.Ended:
		out.Status = Closed
	case out.HandedOff && held.Copy:
		out.Status = Copy
	case out.HandedOff:
		out.Status = HandedOff
	case st.Phase == record.Parked && st.Parked.IsTranscript():
		out.Status = ParkedTranscript
	case st.Phase == record.Parked:
		out.Status = ParkedImage
	case r != nil && r.live != nil:
		out.Status = Running
	default:
		out.Status = Lost
	}
	return out, nil
}

// Run returns a run's summary.
func (d *Daemon) Run(id string) (Summary, error) {
	d.mu.Lock()
	r := d.runs[id]
	d.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	return d.summary(id, r)
}

// List lists runs, in id order: every run, or those in phase when it is
// not nil.
func (d *Daemon) List(phase *record.Phase) ([]Summary, error) {
	var ids []string
	var err error
	if phase == nil {
		ids, err = d.st.AllRuns()
	} else {
		ids, err = d.st.Runs(*phase)
	}
	if err != nil {
		return nil, err
	}
	out := make([]Summary, 0, len(ids))
	for _, id := range ids {
		s, err := d.Run(id)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// stepClock times an operation's steps for its reply.
type stepClock struct {
	start, last time.Time
	steps       []Step
}

func newStepClock() *stepClock {
	now := time.Now()
	return &stepClock{start: now, last: now}
}

// mark ends the step called name (on a nil clock, nothing).
func (c *stepClock) mark(name string) {
	if c == nil {
		return
	}
	now := time.Now()
	c.steps = append(c.steps, Step{Name: name, Took: now.Sub(c.last)})
	c.last = now
}

// total is the time since the operation began.
func (c *stepClock) total() time.Duration { return time.Since(c.start) }
