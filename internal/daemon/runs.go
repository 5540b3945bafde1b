package daemon

import (
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/pkg/record"
)

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

// summary is run id as this host holds it; r is its state here, nil when
// it has none (answers.Summarize).
func (d *Daemon) summary(id string, r *run) (answers.Summary, error) {
	var opened time.Time
	if r != nil && r.live != nil && r.live.iv != nil {
		opened = r.live.iv.Start()
	}
	return answers.Summarize(d.st, id, r != nil && r.live != nil, opened)
}

// Run returns a run's summary.
func (d *Daemon) Run(id string) (answers.Summary, error) {
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
func (d *Daemon) List(phase *record.Phase) ([]answers.Summary, error) {
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
	out := make([]answers.Summary, 0, len(ids))
	for _, id := range ids {
		s, err := d.Run(id)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
