package calls

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Fill completes run's ledger from the journals of its record, once: the
// kind and call object of every call awaiting a result that the ledger
// holds without one (a call dispatched in a record written elsewhere — a
// bundle imported, or one extending the run — or before the ledger
// existed), and, for a parked run whose last interval's await the ledger
// does not know, that await (an await entry of none: the interval awaited
// nothing, and every outstanding call is awaited; a run with no call
// awaiting a result needs none). It reads only the
// journals of the intervals concerned, each as a stream verified against
// its address. A run whose ledger is complete costs one ledger read.
func Fill(st Store, run string) error {
	l, err := st.Calls(run)
	if err != nil {
		return err
	}
	need := map[uint64]map[string]bool{} // interval → calls without an object
	known := map[string]bool{}
	waiting := false // a call awaits a result: an await matters
	for _, c := range l.Calls {
		known[c.ID] = true
		waiting = waiting || c.State != store.CallResolved
		if c.State != store.CallResolved && !c.Open && c.Payload.IsZero() {
			if need[c.Interval] == nil {
				need[c.Interval] = map[string]bool{}
			}
			need[c.Interval][c.ID] = true
		}
	}
	r, err := st.Run(run)
	if err != nil {
		return err
	}
	var awaitIn uint64
	if r.Phase == record.PhaseParked && !l.AwaitKnown && l.Intervals > 0 && waiting {
		awaitIn = l.Intervals
	}
	if len(need) == 0 && awaitIn == 0 {
		return nil
	}
	raw, err := st.Raw(run)
	if err != nil {
		return err
	}
	var atts []record.Address // by interval, from 1
	for _, s := range raw.Segments {
		if s.Kind == record.Executed {
			atts = append(atts, s.Attestation)
		}
	}
	intervals := make([]uint64, 0, len(need)+1)
	for n := range need {
		intervals = append(intervals, n)
	}
	if awaitIn > 0 && need[awaitIn] == nil {
		intervals = append(intervals, awaitIn)
	}
	slices.Sort(intervals)
	var ds []store.Dispatch
	var awaited []string
	for _, n := range intervals {
		if n == 0 || n > uint64(len(atts)) {
			return fmt.Errorf("run %s: %w: the ledger names interval %d of a record of %d", run, store.ErrDamaged, n, len(atts))
		}
		found, ids, err := fromJournal(st, atts[n-1], need[n], n == awaitIn)
		if err != nil {
			return fmt.Errorf("run %s: interval %d's journal: %w", run, n, err)
		}
		ds = append(ds, found...)
		if n == awaitIn {
			awaited = slices.DeleteFunc(ids, func(id string) bool { return !known[id] })
		}
	}
	if len(ds) > 0 {
		if err := st.Annotate(run, ds...); err != nil {
			return err
		}
	}
	if awaitIn > 0 {
		return st.Await(run, awaitIn, awaited)
	}
	return nil
}

// fromJournal reads the interval attested at att for the dispatches of
// want, storing each one's entry as its call object, and, with await, for
// the ids of its last await entry.
func fromJournal(st Store, att record.Address, want map[string]bool, await bool) ([]store.Dispatch, []string, error) {
	var ds []store.Dispatch
	var awaited []byte
	var perr error
	kinds := []attest.EntryKind{attest.Dispatch}
	if await {
		kinds = append(kinds, attest.Lifecycle)
	}
	err := scanJournal(st, att, kinds, func(e attest.Entry) {
		if e.Kind == attest.Lifecycle {
			if rest, ok := bytes.CutPrefix(e.Data, []byte("await ")); ok {
				awaited = rest
			}
			return
		}
		var c struct{ ID, Kind string }
		if json.Unmarshal(e.Data, &c) != nil || !want[c.ID] || perr != nil {
			return
		}
		// Stored before the journal is verified at its end: an object
		// of a journal that fails is named by nothing, and collected.
		a, err := st.PutBytes(e.Data)
		if err != nil {
			perr = err
			return
		}
		delete(want, c.ID)
		ds = append(ds, store.Dispatch{ID: c.ID, Kind: c.Kind, Payload: a})
	})
	if err == nil {
		err = perr
	}
	if err != nil {
		return nil, nil, err
	}
	var ids []string
	if awaited != nil && json.Unmarshal(awaited, &ids) != nil {
		ids = nil
	}
	return ds, ids, nil
}

// Upgrade brings a state directory written by a daemon before the ledger
// into it: each result that daemon kept as a file, dir/RUN/NAME (NAME
// from [resultName] or [legacyResultName] of the call's id), is posted to
// the ledger and the run's directory removed; a file for no call awaiting
// a result is dropped with it. Then every open run's ledger is filled in
// ([Fill]): the migration that made the ledger (internal/store, 5 → 6) could
// not read journals. Run at every start, it does nothing once done. A
// run it cannot bring in is reported in the error and keeps its files
// for the next start; the others are done.
func Upgrade(st Store, dir string) error {
	var errs []error
	runs, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		errs = append(errs, err)
	default:
		for _, e := range runs {
			if !e.IsDir() {
				os.Remove(filepath.Join(dir, e.Name())) // not the last daemon's: nothing to bring in
				continue
			}
			if err := importResults(st, dir, e.Name()); err != nil {
				errs = append(errs, fmt.Errorf("run %s: legacy results: %w", e.Name(), err))
			}
		}
		if len(errs) == 0 {
			if err := os.Remove(dir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, p := range []record.Phase{record.PhaseExecuting, record.PhaseParked} {
		ids, err := st.Runs(p)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, id := range ids {
			if err := Fill(st, id); err != nil {
				errs = append(errs, fmt.Errorf("run %s: filling in its calls: %w", id, err))
			}
		}
	}
	return errors.Join(errs...)
}

// importResults posts the results in dir/run to run's ledger, then
// removes the directory.
func importResults(st Store, dir, run string) error {
	rdir := filepath.Join(dir, run)
	files, err := os.ReadDir(rdir)
	if err != nil {
		return err
	}
	l, err := st.Calls(run)
	if err != nil && !errors.Is(err, store.ErrNoRun) {
		return err
	}
	byName := map[string]store.Call{}
	for _, c := range l.Calls {
		if c.State == store.CallResolved {
			continue
		}
		byName[resultName(c.ID)] = c
		if n, ok := legacyResultName(c.ID); ok {
			byName[n] = c
		}
	}
	for _, f := range files {
		c, ok := byName[f.Name()]
		if !ok || !f.Type().IsRegular() || c.State != store.CallOutstanding {
			continue
		}
		b, err := os.ReadFile(filepath.Join(rdir, f.Name()))
		if err != nil {
			return err
		}
		err = Post(st, run, c.ID, b)
		switch {
		case errors.Is(err, ErrRefused), errors.Is(err, ErrNotJSON), errors.Is(err, store.ErrHandedOff), errors.Is(err, record.ErrClosed):
			// A result the run cannot take now is dropped, as the
			// daemon that kept it would have refused it.
		case err != nil:
			return err
		}
	}
	return os.RemoveAll(rdir)
}

// resultName is the file a daemon before the ledger kept a call's result
// in: the SHA-256 of its id, so that any id the protocol takes (up to 256
// bytes) names a file within NAME_MAX.
func resultName(call string) string {
	h := sha256.Sum256([]byte(call))
	return "sha256-" + hex.EncodeToString(h[:])
}

// legacyResultName is the name an earlier daemon still gave a result
// (base64 of the id), where it fits in a file name.
func legacyResultName(call string) (string, bool) {
	n := base64.RawURLEncoding.EncodeToString([]byte(call))
	return n, len(n) <= 255
}
