package store

import (
	"fmt"
	"maps"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// checkLedger verifies run's call ledger against its record r, which
// verified: a closed run has none; an open run's holds exactly the calls
// its accounts dispatched, each in the interval that dispatched it and
// resolved in the interval whose account resolved it (its result let
// go), plus — only while the run executes — calls dispatched in the open
// interval and results delivered in it; and its head counts the record's
// executed intervals. The expected ledger is computed here from the
// accounts, not by the fold that writes it.
func checkLedger(tx *bolt.Tx, run string, r *record.Record) error {
	l, err := ledgerOf(tx, run)
	if err != nil {
		return err
	}
	damaged := func(format string, a ...any) error {
		return fmt.Errorf("run %s: %w: call ledger: %s", run, ErrDamaged, fmt.Sprintf(format, a...))
	}
	if r.Phase() == record.PhaseClosed {
		if l != nil {
			return damaged("a closed run keeps one")
		}
		return nil
	}
	if l == nil {
		return damaged("none for a %s run", r.Phase())
	}
	exp, n := expectedCalls(r)
	if l.h.intervals != n {
		return damaged("counts %d executed intervals, the record %d", l.h.intervals, n)
	}
	open, active := n+1, r.Phase() == record.PhaseExecuting
	touched := 0
	err = l.each(func(id string, e callEntry) error {
		w, onRecord := exp[id]
		delete(exp, id)
		switch {
		case e.interval == open:
			if !active || onRecord {
				return damaged("call %s dispatched in interval %d, which is not open (the run is %s, or the record has it too)", id, open, r.Phase())
			}
			touched++
		case !onRecord || w.interval != e.interval:
			return damaged("call %s dispatched in interval %d: the record does not say so", id, e.interval)
		case w.resolvedIn != 0:
			if e.state != CallResolved || e.resolvedIn != w.resolvedIn || !e.result.IsZero() {
				return damaged("call %s is %s (in %d), the record resolved it in %d", id, e.state, e.resolvedIn, w.resolvedIn)
			}
			return nil
		case e.state == CallResolved:
			if !active {
				return damaged("call %s resolved in interval %d, which the record does not say", id, e.resolvedIn)
			}
			touched++
		}
		if e.state == CallResolved && (e.resolvedIn != open || e.result.IsZero()) {
			return damaged("call %s resolved in the open interval %d as %d, result %s", id, open, e.resolvedIn, e.result)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(exp) > 0 {
		return damaged("the record dispatched call %s; the ledger does not hold it", slices.Sorted(maps.Keys(exp))[0])
	}
	if touched > 0 && l.h.open == 0 {
		return damaged("%d calls touched in the open interval, none counted", touched)
	}
	return nil
}

// expected is a call as a record's accounts leave it.
type expected struct{ interval, resolvedIn uint64 }

// expectedCalls folds r's accounts: every call dispatched, in the interval
// that dispatched it (the last, for an id dispatched twice) and resolved
// by the first account after it that resolves it; and the number of
// executed intervals.
func expectedCalls(r *record.Record) (map[string]expected, uint64) {
	exp := map[string]expected{}
	var n uint64
	for i := range r.Len() {
		seg := r.Segment(i)
		if seg.Kind != record.Executed {
			continue
		}
		n++
		if seg.Calls == nil {
			continue
		}
		for _, id := range seg.Calls.Dispatched {
			exp[id] = expected{interval: n}
		}
		for _, id := range seg.Calls.Resolved {
			if w, ok := exp[id]; ok && (w.resolvedIn == 0 || w.resolvedIn == n) {
				w.resolvedIn = n
				exp[id] = w
			}
		}
	}
	return exp, n
}

// checkLedgerRuns verifies that every ledger belongs to a stored run.
func checkLedgerRuns(tx *bolt.Tx) error {
	return tx.Bucket(bktCalls).ForEach(func(k, v []byte) error {
		if v != nil || tx.Bucket(bktRuns).Get(k) == nil {
			return fmt.Errorf("run %s: %w: a call ledger of no stored run", k, ErrDamaged)
		}
		return nil
	})
}

// appendLedgerRoots appends every object a call ledger names: call
// objects and posted results, kept while the ledger names them.
func appendLedgerRoots(dst []record.Address, tx *bolt.Tx) ([]record.Address, error) {
	err := tx.Bucket(bktCalls).ForEachBucket(func(k []byte) error {
		l, err := ledgerOf(tx, string(k))
		if err != nil {
			return err
		}
		return l.each(func(_ string, e callEntry) error {
			for _, a := range [2]record.Address{e.payload, e.result} {
				if !a.IsZero() {
					dst = append(dst, a)
				}
			}
			return nil
		})
	})
	return dst, err
}
