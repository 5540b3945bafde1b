package calls

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Objects is what the room reads and writes of the object store.
type Objects interface {
	Put(ctx context.Context, r io.Reader, refs ...record.Address) (record.Address, error)
	PutBytes(b []byte, refs ...record.Address) (record.Address, error)
	Open(a record.Address) (*store.Reader, error)
	ReadAll(a record.Address) ([]byte, error)
	Size(a record.Address) (int64, error)
}

// Ledger is the store's call ledger (internal/store, calls.go).
type Ledger interface {
	Calls(run string) (store.Ledger, error)
	Call(run, id string) (store.Call, bool, error)
	Outstanding() ([]store.RunCall, error)
	Dispatched(run string, interval uint64, calls ...store.Dispatch) error
	Annotate(run string, calls ...store.Dispatch) error
	Post(run, call string, result record.Address) error
	Resolve(run string, interval uint64, ids ...string) error
	Await(run string, interval uint64, ids []string) error
}

// Records is what the room reads of the records: a run's phase, and the
// segments whose journals fill a ledger in.
type Records interface {
	Run(id string) (store.Run, error)
	Runs(phase record.Phase) ([]string, error)
	Raw(id string) (store.Raw, error)
}

// Store is what the room needs of the store (*store.Store).
type Store interface {
	Objects
	Ledger
	Records
}

// Errors of the room. Refusals of the ledger are wrapped: errors.Is
// finds both these and internal/store's.
var (
	// ErrRefused is a result the run cannot take: for a call it never
	// dispatched (or whose interval was not recorded), one already
	// resolved, or one that already has a result. Nothing was written.
	ErrRefused = errors.New("call refused")
	// ErrNotJSON is a posted result that is not JSON.
	ErrNotJSON = errors.New("the result payload is not JSON")
)

// Post keeps payload, the result the platform posted for run's call, as
// an object named by the call's ledger entry. It refuses (ErrRefused) a
// call the ledger does not hold, one resolved and one with a result;
// internal/store refuses a closed run (record.ErrClosed) and a run held
// elsewhere (store.ErrHandedOff). The caller resumes a parked run the
// result completes ([Awaiting]).
func Post(st Store, run, call string, payload []byte) error {
	if !json.Valid(payload) {
		return ErrNotJSON
	}
	// Read first, so that a refused result leaves no object behind;
	// the ledger judges again as it writes.
	c, ok, err := st.Call(run, call)
	if err != nil {
		return err
	}
	if !ok {
		// A closed run has no ledger: say so rather than that the call
		// is unknown.
		if r, err := st.Run(run); err != nil || r.Phase == record.PhaseClosed {
			return cmp.Or(err, fmt.Errorf("run %s: %w", run, record.ErrClosed))
		}
	}
	if err := refusal(run, call, c, ok); err != nil {
		return err
	}
	a, err := st.PutBytes(payload)
	if err != nil {
		return err
	}
	err = st.Post(run, call, a)
	switch {
	case errors.Is(err, store.ErrUnknownCall):
		return refusal(run, call, store.Call{}, false)
	case errors.Is(err, store.ErrCallResolved), errors.Is(err, store.ErrResultPosted):
		return fmt.Errorf("run %s: call %s: %w: %w", run, call, ErrRefused, err)
	}
	return err
}

// refusal says why c (ok: the ledger holds it) takes no result.
func refusal(run, call string, c store.Call, ok bool) error {
	switch {
	case !ok:
		return fmt.Errorf("run %s: call %s: %w: the run never dispatched it (or the interval that did was not recorded)", run, call, ErrRefused)
	case c.State == store.CallResolved:
		return fmt.Errorf("run %s: call %s: %w: already resolved", run, call, ErrRefused)
	case c.State == store.CallPosted:
		return fmt.Errorf("run %s: call %s: %w: a result was already posted", run, call, ErrRefused)
	}
	return nil
}

// Awaiting returns the calls parked run still awaits a result for: of the
// calls its last interval's await named, those with none posted; when the
// ledger knows no such await (an interval parked by an operator, or
// recovered), every call outstanding. Empty, the run can resume.
func Awaiting(st Store, run string) ([]string, error) {
	l, err := st.Calls(run)
	if err != nil {
		return nil, err
	}
	named := false
	for _, c := range l.Calls {
		named = named || c.Awaited && c.State != store.CallResolved
	}
	var out []string
	for _, c := range l.Calls {
		if c.State == store.CallOutstanding && (c.Awaited || !named) {
			out = append(out, c.ID)
		}
	}
	return out, nil
}

// Held returns the calls of run with a result posted here and not yet
// delivered: a bundle does not carry them.
func Held(st Store, run string) ([]string, error) {
	l, err := st.Calls(run)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range l.Calls {
		if c.State == store.CallPosted {
			out = append(out, c.ID)
		}
	}
	return out, nil
}

// Listed is a call awaiting its result, as GET /v1/calls lists it.
type Listed struct {
	Run          string
	Phase        record.Phase // the run's
	ID, Kind     string
	Payload      json.RawMessage // null when the ledger has no call object for it
	ResultPosted bool
}

// List lists the calls awaiting results in every run this host holds (not
// closed, not held elsewhere), ordered by run and id: from the ledger,
// each payload read from its call object. No journal is read.
func List(st Store) ([]Listed, error) {
	rcs, err := st.Outstanding()
	if err != nil {
		return nil, err
	}
	out := make([]Listed, 0, len(rcs))
	for _, rc := range rcs {
		l := Listed{Run: rc.Run, Phase: rc.Phase, ID: rc.ID, Kind: rc.Kind, ResultPosted: rc.State == store.CallPosted}
		if !rc.Payload.IsZero() {
			// A call object that cannot be read lists the call without
			// its payload rather than failing every run's listing.
			if b, err := st.ReadAll(rc.Payload); err == nil {
				var c struct {
					Payload json.RawMessage `json:"payload"`
				}
				if json.Unmarshal(b, &c) == nil {
					l.Payload = c.Payload
				}
			}
		}
		out = append(out, l)
	}
	return out, nil
}
