package daemon

import (
	"fmt"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// runTable is this host's runs beyond their records, each under its own
// lock: it holds only runs that exist in st, or are being created.
type runTable struct {
	st   *store.Store
	mu   sync.Mutex
	runs map[string]*run
}

// lockRun returns the state of run id, which must be stored, locked: a
// request naming no run leaves nothing behind. The caller unlocks it.
func (t *runTable) lockRun(id string) (*run, error) {
	if _, err := t.st.Run(id); err != nil {
		return nil, err
	}
	return t.lock(id), nil
}

// lock returns run id's state, locked, making it for a run being created.
// The caller unlocks it.
func (t *runTable) lock(id string) *run {
	t.mu.Lock()
	if t.runs == nil {
		t.runs = map[string]*run{}
	}
	r := t.runs[id]
	if r == nil {
		r = &run{}
		t.runs[id] = r
	}
	t.mu.Unlock()
	r.mu.Lock()
	return r
}

// locker is lockRun as bundle.Exporter.Lock takes it.
func (t *runTable) locker(id string) (func(), error) {
	r, err := t.lockRun(id)
	if err != nil {
		return nil, err
	}
	return r.mu.Unlock, nil
}

// peek returns run id's state without its lock; nil when it has none.
func (t *runTable) peek(id string) *run {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.runs[id]
}

// all is a copy of the table.
func (t *runTable) all() map[string]*run {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]*run, len(t.runs))
	for id, r := range t.runs {
		out[id] = r
	}
	return out
}

// summary is run id as this host holds it; r is its state here, nil when
// it has none (answers.Summarize).
func (t *runTable) summary(id string, r *run) (answers.Summary, error) {
	var opened time.Time
	if r != nil && r.live != nil && r.live.iv != nil {
		opened = r.live.iv.Start()
	}
	return answers.Summarize(t.st, id, r != nil && r.live != nil, opened)
}

// phaseErr reports why a run in phase p cannot do what wants (nil when it
// can).
func phaseErr(id string, p record.Phase, want record.Phase) error {
	if p == want {
		return nil
	}
	switch p {
	case record.PhaseClosed:
		return fmt.Errorf("run %s: %w", id, record.ErrClosed)
	case record.PhaseParked:
		return fmt.Errorf("run %s: %w", id, record.ErrParked)
	default:
		return fmt.Errorf("run %s: %w", id, record.ErrNotParked)
	}
}

// Run returns a run's summary.
func (d *Daemon) Run(id string) (answers.Summary, error) {
	r := d.runs.peek(id)
	if r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	return d.runs.summary(id, r)
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
