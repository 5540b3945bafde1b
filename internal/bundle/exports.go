package bundle

import (
	"sync"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Exports keeps the books of the exports of one store in this process: per
// run, how many exports are streaming, whether one delivered its bundle
// whole since the handoff, and whether this process made that handoff. A
// failed export takes the handoff back only when this process made it, no
// other export of the run is streaming, and none was delivered whole:
// otherwise a bundle may be out there, and the run must stay handed off.
// The zero Exports is ready to use.
type Exports struct {
	mu   sync.Mutex
	runs map[string]*books
}

type books struct {
	streaming int
	delivered bool // one export delivered its bundle whole since the handoff
	made      bool // this process made the handoff
}

// Reclaimer takes a handoff back ([store.Store.Reclaim]).
type Reclaimer interface {
	Reclaim(id string, head record.Address) error
}

// Begin decides run's export ([Prepare]) and counts it as streaming. The
// caller holds its lock on the run, as for Prepare, and calls End once the
// bundle is written, or not.
func (e *Exports) Begin(st Runs, run string, handoff bool) (ExportOptions, bool, error) {
	o, made, err := Prepare(st, run, handoff)
	if err != nil {
		return o, made, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.runs == nil {
		e.runs = map[string]*books{}
	}
	b := e.runs[run]
	if b == nil {
		b = &books{}
		e.runs[run] = b
	}
	if made {
		b.made, b.delivered = true, false
	}
	b.streaming++
	return o, made, nil
}

// Ended is what End did.
type Ended int

const (
	// Kept: nothing changed hands (a copy, or a failure with a bundle
	// possibly out there).
	Kept Ended = iota
	// HandedOff: the bundle was delivered and this export made the handoff.
	HandedOff
	// TakenBack: the export failed and its handoff was taken back; the run
	// is this host's again.
	TakenBack
)

// End closes the books of an export of run that Begin began with o and
// made, and that ended with err; a handoff it takes back is reclaimed in
// st. It returns what it did, and the reclaim's error.
func (e *Exports) End(st Reclaimer, run string, o ExportOptions, made bool, err error) (Ended, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.runs[run]
	b.streaming--
	defer func() {
		if b.streaming == 0 && (!b.made || b.delivered) {
			delete(e.runs, run) // nothing left to decide for it
		}
	}()
	switch {
	case o.Copy:
		return Kept, nil
	case err == nil:
		b.delivered = true
		if made {
			return HandedOff, nil
		}
		return Kept, nil
	case b.made && b.streaming == 0 && !b.delivered:
		if rerr := st.Reclaim(run, o.Record.Head()); rerr != nil {
			return Kept, rerr
		}
		b.made = false
		return TakenBack, nil
	}
	return Kept, nil
}
