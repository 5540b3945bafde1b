package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// The call ledger (schema version 6): the API. The package doc says what
// it holds and how it follows the record; docs/store.md gives its bytes.

// maxKindLen bounds a call's kind, as the unit protocol does.
const maxKindLen = record.MaxCallIDLen

// CallState is where a call stands.
type CallState uint8

const (
	// CallOutstanding: dispatched; no result posted.
	CallOutstanding CallState = 1
	// CallPosted: the platform posted its result; not yet delivered.
	CallPosted CallState = 2
	// CallResolved: its result was delivered: in an interval on the
	// record, or in the open interval (ResolvedIn is Intervals+1), which
	// the interval's account confirms when it is recorded.
	CallResolved CallState = 3
)

func (s CallState) String() string {
	switch s {
	case CallOutstanding:
		return "outstanding"
	case CallPosted:
		return "posted"
	case CallResolved:
		return "resolved"
	}
	return fmt.Sprintf("CallState(%d)", uint8(s))
}

// Call is one call of a run's ledger.
type Call struct {
	ID   string
	Kind string // "" while not known (see [Store.Annotate])
	// Interval is the interval that dispatched it, counting a run's
	// executed intervals from 1.
	Interval uint64
	// Payload is the call object: the dispatch's JSON (id, kind,
	// payload), the bytes of its journal entry; zero while not known.
	Payload    record.Address
	State      CallState
	Result     record.Address // the posted result's object (CallPosted; CallResolved in the open interval)
	ResolvedIn uint64         // the interval that resolved it (CallResolved)
	// Awaited: the await of the run's last recorded interval names it.
	Awaited bool
	// Open: dispatched in the run's open interval, not yet on the record.
	Open bool
}

// Ledger is one run's calls.
type Ledger struct {
	// Intervals is the number of executed intervals on the record; the
	// open interval, while the run executes, is Intervals+1.
	Intervals uint64
	// AwaitKnown: the ledger knows the await of the last recorded
	// interval (Call.Awaited names its ids; naming none, that interval
	// awaited nothing the ledger knows).
	AwaitKnown bool
	Calls      []Call // in id order
}

// Dispatch is a call as its unit dispatched it.
type Dispatch struct {
	ID, Kind string
	Payload  record.Address // the call object, stored before
}

// RunCall is a call awaiting its result in a run this host holds.
type RunCall struct {
	Run   string
	Phase record.Phase
	Call
}

// Calls returns run's ledger; a closed run has none (an empty Ledger).
func (s *Store) Calls(run string) (Ledger, error) {
	var out Ledger
	err := s.view(func(tx *bolt.Tx) error {
		if _, err := getState(tx, run); err != nil {
			return err
		}
		l, err := ledgerOf(tx, run)
		if err != nil || l == nil {
			return err
		}
		out = Ledger{Intervals: l.h.intervals, AwaitKnown: l.awaitKnown()}
		return l.each(func(id string, e callEntry) error {
			out.Calls = append(out.Calls, l.call(id, e))
			return nil
		})
	})
	return out, err
}

// Call returns one call of run's ledger; ok is false when it has none by
// that id.
func (s *Store) Call(run, id string) (c Call, ok bool, err error) {
	err = s.view(func(tx *bolt.Tx) error {
		if _, err := getState(tx, run); err != nil {
			return err
		}
		l, err := ledgerOf(tx, run)
		if err != nil || l == nil {
			return err
		}
		e, found, err := l.get(id)
		if found {
			c, ok = l.call(id, e), true
		}
		return err
	})
	return c, ok, err
}

// Outstanding lists every call awaiting its result — outstanding or
// posted, not delivered — of every run this host holds: not closed, and
// not held elsewhere (handed off, or a copy), whose platform posts to the
// host that holds it. Ordered by run, then call id.
func (s *Store) Outstanding() ([]RunCall, error) {
	var out []RunCall
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktCalls).ForEachBucket(func(k []byte) error {
			run := string(k)
			if tx.Bucket(bktHandof).Get(k) != nil {
				return nil
			}
			st, err := getState(tx, run)
			if err != nil {
				return err
			}
			l, err := ledgerOf(tx, run)
			if err != nil {
				return err
			}
			return l.each(func(id string, e callEntry) error {
				if e.state != CallResolved {
					out = append(out, RunCall{Run: run, Phase: st.phase, Call: l.call(id, e)})
				}
				return nil
			})
		})
	})
	return out, err
}

// checkDispatches refuses a malformed id or kind ([ErrCallID]) and a call
// object the store does not hold ([ErrMissingObject]).
func (s *Store) checkDispatches(run string, calls []Dispatch) error {
	for _, c := range calls {
		if err := checkCall(c.ID, c.Kind); err != nil {
			return fmt.Errorf("run %s: %w", run, err)
		}
		if err := s.haveAll([]record.Address{c.Payload}); err != nil {
			return fmt.Errorf("run %s: call %s: %w", run, c.ID, err)
		}
	}
	return nil
}

// Dispatched records calls the unit dispatched in run's open interval,
// interval: each outstanding, in the open interval until its account is
// recorded. It refuses, writing nothing, a run that is not executing or an
// interval that is not its open one ([ErrInterval]), an id the ledger
// holds ([ErrCallExists]), a malformed id or kind ([ErrCallID]), and a
// call object the store does not hold ([ErrMissingObject]).
func (s *Store) Dispatched(run string, interval uint64, calls ...Dispatch) error {
	s.gc.RLock()
	defer s.gc.RUnlock()
	if err := s.checkDispatches(run, calls); err != nil {
		return err
	}
	return s.commit(func(tx *bolt.Tx) error {
		l, err := openLedger(tx, run, interval, false)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, c := range calls {
			if _, ok, err := l.get(c.ID); err != nil || ok || seen[c.ID] {
				return refuse(fmt.Errorf("run %s: call %s: %w (%v)", run, c.ID, ErrCallExists, err))
			}
			seen[c.ID] = true
		}
		for _, c := range calls {
			if err := l.put(c.ID, callEntry{state: CallOutstanding, interval: interval, payload: c.Payload, kind: c.Kind}); err != nil {
				return err
			}
		}
		l.h.open += uint32(len(calls))
		return l.saveHead()
	})
}

// Annotate gives calls on run's record that the ledger holds without a
// call object (dispatched in a record written elsewhere, or before the
// ledger) their kind and call object, read back from their journals. A
// call already annotated is left as it is; one the ledger does not hold
// is [ErrUnknownCall].
func (s *Store) Annotate(run string, calls ...Dispatch) error {
	s.gc.RLock()
	defer s.gc.RUnlock()
	if err := s.checkDispatches(run, calls); err != nil {
		return err
	}
	return s.commit(func(tx *bolt.Tx) error {
		l, err := writableLedger(tx, run)
		if err != nil {
			return err
		}
		return l.update(calls2ids(calls), func(i int, e *callEntry) error {
			if e.payload.IsZero() {
				e.kind, e.payload = calls[i].Kind, calls[i].Payload
			}
			return nil
		})
	})
}

// Post keeps result, an object stored before, as the result of run's
// call. It refuses, writing nothing, a closed run ([record.ErrClosed]), a
// run held elsewhere ([ErrHandedOff]), a call the ledger does not hold
// ([ErrUnknownCall]: never dispatched, or dispatched in an interval that
// was not recorded), one already resolved ([ErrCallResolved]) and one
// that has a result ([ErrResultPosted]).
func (s *Store) Post(run, call string, result record.Address) error {
	s.gc.RLock()
	defer s.gc.RUnlock()
	if err := s.haveAll([]record.Address{result}); err != nil {
		return fmt.Errorf("run %s: call %s: result: %w", run, call, err)
	}
	return s.commit(func(tx *bolt.Tx) error {
		l, err := writableLedger(tx, run)
		if err != nil {
			return err
		}
		if tx.Bucket(bktHandof).Get([]byte(run)) != nil {
			return refuse(fmt.Errorf("run %s: %w", run, ErrHandedOff))
		}
		return l.update([]string{call}, func(_ int, e *callEntry) error {
			switch e.state {
			case CallResolved:
				return refuse(fmt.Errorf("run %s: call %s: %w", run, call, ErrCallResolved))
			case CallPosted:
				return refuse(fmt.Errorf("run %s: call %s: %w", run, call, ErrResultPosted))
			}
			e.state, e.result = CallPosted, result
			return nil
		})
	})
}

// Resolve records that the results of ids, each posted, were delivered to
// the unit in run's open interval, interval; the interval's account
// confirms it when recorded (or, not naming them, posts them again). It
// refuses, writing nothing, an interval that is not the run's open one
// ([ErrInterval]), an unknown call, one resolved, and one with no result
// ([ErrNoResult]).
func (s *Store) Resolve(run string, interval uint64, ids ...string) error {
	return s.commit(func(tx *bolt.Tx) error {
		l, err := openLedger(tx, run, interval, false)
		if err != nil {
			return err
		}
		err = l.update(ids, func(i int, e *callEntry) error {
			switch e.state {
			case CallResolved:
				return refuse(fmt.Errorf("run %s: call %s: %w", run, ids[i], ErrCallResolved))
			case CallOutstanding:
				return refuse(fmt.Errorf("run %s: call %s: %w", run, ids[i], ErrNoResult))
			}
			e.state, e.resolvedIn = CallResolved, interval
			return nil
		})
		if err != nil {
			return err
		}
		l.h.open += uint32(len(ids))
		return l.saveHead()
	})
}

// Await records that the unit awaits ids: in run's open interval,
// interval, or — filling in the await of a record written elsewhere — in
// its last recorded one. The ids replace the flags of any earlier await;
// none, the interval awaited nothing the ledger knows. Each must be a call
// of the ledger ([ErrUnknownCall]).
func (s *Store) Await(run string, interval uint64, ids []string) error {
	return s.commit(func(tx *bolt.Tx) error {
		l, err := openLedger(tx, run, interval, true)
		if err != nil {
			return err
		}
		want := setOf(ids)
		for _, id := range ids {
			if _, ok, err := l.get(id); err != nil || !ok {
				return refuse(fmt.Errorf("run %s: call %s: %w (%v)", run, id, ErrUnknownCall, err))
			}
		}
		changed := map[string]callEntry{}
		err = l.each(func(id string, e callEntry) error {
			if e.awaited != want[id] {
				e.awaited = want[id]
				changed[id] = e
			}
			return nil
		})
		if err != nil {
			return refuse(err)
		}
		for id, e := range changed {
			if err := l.put(id, e); err != nil {
				return err
			}
		}
		l.h.awaitedIn = interval
		return l.saveHead()
	})
}
