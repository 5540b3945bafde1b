package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// followCalls runs then (when not nil; it may refuse) and folds segs,
// about to be appended to run, into the run's ledger. A run with no
// ledger is refused before then runs: nothing is appended to a closed
// run, so an open one without a ledger is a damaged store.
func followCalls(tx *bolt.Tx, run string, segs []record.Segment, then func(tx *bolt.Tx) error) error {
	l, err := ledgerOf(tx, run)
	if err == nil && l == nil {
		err = fmt.Errorf("run %s: %w: no call ledger", run, ErrDamaged)
	}
	if err != nil {
		return refuse(err)
	}
	if then != nil {
		if err := then(tx); err != nil {
			return err
		}
	}
	_, err = l.follow(tx, segs)
	return err
}

// follow keeps the ledger with segments appended to its run: an Executed
// segment is folded in (see executed); a Closed one removes the ledger.
// It reports whether the ledger is still there.
func (l *runLedger) follow(tx *bolt.Tx, segs []record.Segment) (bool, error) {
	for i := range segs {
		switch segs[i].Kind {
		case record.Executed:
			if err := l.executed(segs[i].Calls); err != nil {
				return true, err
			}
		case record.Closed:
			return false, tx.Bucket(bktCalls).DeleteBucket([]byte(l.run))
		}
	}
	return true, l.saveHead()
}

// executed folds the next Executed segment's account into the ledger.
// The entries the open interval touched are confirmed by it or undone:
// a call dispatched in it and not in the account is dropped (its dispatch
// is not on the record: an unaccounted interval, acct nil, drops them
// all), a result delivered in it and not resolved by the account is
// posted again. Then every id the account dispatches is outstanding from
// this interval (a call the ledger did not hold — a record written
// elsewhere — without kind or call object), and every id it resolves and
// the ledger holds unresolved is resolved in it, its result object let
// go (its bytes are in the interval's journal).
func (l *runLedger) executed(acct *record.CallAccount) error {
	n := l.h.intervals + 1
	var dispatched, resolved map[string]bool
	if acct != nil {
		dispatched, resolved = setOf(acct.Dispatched), setOf(acct.Resolved)
	}
	if l.h.open > 0 {
		var drop [][]byte
		undo := map[string]callEntry{}
		err := l.each(func(id string, e callEntry) error {
			switch {
			case e.interval == n && !dispatched[id]:
				drop = append(drop, []byte(id))
			case e.state == CallResolved && e.resolvedIn == n && !resolved[id]:
				e.state, e.resolvedIn = CallPosted, 0
				undo[id] = e
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range drop {
			if err := l.ids.Delete(k); err != nil {
				return err
			}
		}
		for id, e := range undo {
			if err := l.put(id, e); err != nil {
				return err
			}
		}
	}
	if acct != nil {
		for _, id := range acct.Dispatched {
			e, ok, err := l.get(id)
			if err != nil {
				return err
			}
			if !ok || e.interval != n {
				if err := l.put(id, callEntry{state: CallOutstanding, interval: n}); err != nil {
					return err
				}
			}
		}
		for _, id := range acct.Resolved {
			e, ok, err := l.get(id)
			if err != nil {
				return err
			}
			if !ok || e.state == CallResolved && e.resolvedIn != n {
				continue // never dispatched, or resolved before: nothing to resolve
			}
			e.state, e.resolvedIn, e.result = CallResolved, n, record.Address{}
			if err := l.put(id, e); err != nil {
				return err
			}
		}
	}
	l.h.intervals, l.h.open = n, 0
	return nil
}

func setOf(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// migrateCallLedger (5 → 6) creates the call ledger and gives every run
// that is not closed its ledger, folded from its record: every call its
// accounts dispatched, outstanding or resolved as they say, without kinds
// or call objects (those are in journals, which the daemon reads once to
// fill them in), no result posted and no await known.
func migrateCallLedger(tx *bolt.Tx) error {
	if _, err := tx.CreateBucket(bktCalls); err != nil {
		return err
	}
	runs := tx.Bucket(bktRuns)
	if runs == nil {
		return fmt.Errorf("%w: no runs bucket", ErrDamaged)
	}
	type open struct {
		id string
		st runState
	}
	var todo []open
	err := runs.ForEach(func(id, v []byte) error {
		st, err := decodeState(v)
		if err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		if st.phase != record.PhaseClosed {
			todo = append(todo, open{string(id), st})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, o := range todo {
		entries, err := runEntries(tx, o.id, o.st)
		if err != nil {
			return err
		}
		segs := make([]record.Segment, len(entries))
		for i, e := range entries {
			if segs[i], err = record.DecodeSegment(e.canon); err != nil {
				return fmt.Errorf("run %s: segment %d: %w: %w", o.id, i, ErrDamaged, err)
			}
		}
		l, err := newLedger(tx, o.id)
		if err != nil {
			return err
		}
		if _, err := l.follow(tx, segs); err != nil {
			return err
		}
	}
	return nil
}
