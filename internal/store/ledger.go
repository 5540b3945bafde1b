package store

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// The call ledger's bytes and the fold that keeps it with the record
// (docs/store.md, "The call ledger"). A run's ledger is the bucket
// calls/<run id>: the key "run" holds its head, the bucket "ids" its
// calls by id.

var (
	keyLedgerHead = []byte("run")
	bktLedgerIDs  = []byte("ids")
)

const (
	ledgerFormat  = 1
	ledgerHeadLen = 1 + 8 + 8 + 4
	callEntryLen  = 1 + 1 + 1 + 8 + 8 + 32 + 32 + 2 // without the kind
	flagAwaited   = 1
)

// ledgerHead: format (1, 01) ‖ executed intervals on the record (8) ‖
// the interval whose await the flags name (8; 0 none) ‖ entries touched
// in the open interval (4). Integers are big-endian.
type ledgerHead struct {
	intervals uint64
	awaitedIn uint64
	open      uint32
}

func (h ledgerHead) encode() []byte {
	b := make([]byte, 0, ledgerHeadLen)
	b = append(b, ledgerFormat)
	b = binary.BigEndian.AppendUint64(b, h.intervals)
	b = binary.BigEndian.AppendUint64(b, h.awaitedIn)
	return binary.BigEndian.AppendUint32(b, h.open)
}

func decodeLedgerHead(b []byte) (ledgerHead, error) {
	if len(b) != ledgerHeadLen || b[0] != ledgerFormat {
		return ledgerHead{}, fmt.Errorf("%w: call ledger head of %d bytes is not format %d", ErrDamaged, len(b), ledgerFormat)
	}
	h := ledgerHead{intervals: binary.BigEndian.Uint64(b[1:9]), awaitedIn: binary.BigEndian.Uint64(b[9:17]), open: binary.BigEndian.Uint32(b[17:21])}
	if h.awaitedIn > h.intervals+1 {
		return ledgerHead{}, fmt.Errorf("%w: call ledger head names the await of interval %d of %d", ErrDamaged, h.awaitedIn, h.intervals)
	}
	return h, nil
}

// callEntry: format (1, 01) ‖ state (1) ‖ flags (1; bit 0 awaited) ‖
// dispatched in (8) ‖ resolved in (8; 0 unless resolved) ‖ call object
// (32; zero when not known) ‖ result object (32; zero unless posted, or
// resolved in the open interval) ‖ kind length (2) ‖ kind.
type callEntry struct {
	state      CallState
	awaited    bool
	interval   uint64
	resolvedIn uint64
	payload    record.Address
	result     record.Address
	kind       string
}

func (e callEntry) encode() []byte {
	b := make([]byte, 0, callEntryLen+len(e.kind))
	flags := byte(0)
	if e.awaited {
		flags |= flagAwaited
	}
	b = append(b, ledgerFormat, byte(e.state), flags)
	b = binary.BigEndian.AppendUint64(b, e.interval)
	b = binary.BigEndian.AppendUint64(b, e.resolvedIn)
	b = append(b, e.payload[:]...)
	b = append(b, e.result[:]...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.kind)))
	return append(b, e.kind...)
}

func decodeCallEntry(b []byte) (callEntry, error) {
	bad := func(why string) (callEntry, error) {
		return callEntry{}, fmt.Errorf("%w: call entry of %d bytes: %s", ErrDamaged, len(b), why)
	}
	if len(b) < callEntryLen || b[0] != ledgerFormat {
		return bad("not format 1")
	}
	e := callEntry{state: CallState(b[1]), awaited: b[2]&flagAwaited != 0,
		interval: binary.BigEndian.Uint64(b[3:11]), resolvedIn: binary.BigEndian.Uint64(b[11:19]),
		payload: record.Address(b[19:51]), result: record.Address(b[51:83])}
	n := int(binary.BigEndian.Uint16(b[83:85]))
	switch {
	case b[2]&^flagAwaited != 0:
		return bad("unknown flags")
	case e.state < CallOutstanding || e.state > CallResolved:
		return bad(fmt.Sprintf("state %d", e.state))
	case e.interval == 0 || (e.state == CallResolved) != (e.resolvedIn != 0) || e.resolvedIn != 0 && e.resolvedIn < e.interval:
		return bad(fmt.Sprintf("dispatched in %d, resolved in %d", e.interval, e.resolvedIn))
	case e.state == CallOutstanding && !e.result.IsZero(), e.state == CallPosted && e.result.IsZero():
		return bad(fmt.Sprintf("%s with result %s", e.state, e.result))
	case len(b) != callEntryLen+n || n > maxKindLen || !utf8.Valid(b[85:]):
		return bad("its kind")
	}
	e.kind = string(b[85:])
	return e, nil
}

// runLedger is one run's ledger in a transaction.
type runLedger struct {
	run string
	b   *bolt.Bucket // calls/<run id>
	ids *bolt.Bucket
	h   ledgerHead
}

// ledgerOf returns run's ledger, nil if it has none (a closed run).
func ledgerOf(tx *bolt.Tx, run string) (*runLedger, error) {
	b := tx.Bucket(bktCalls).Bucket([]byte(run))
	if b == nil {
		return nil, nil
	}
	l := &runLedger{run: run, b: b, ids: b.Bucket(bktLedgerIDs)}
	h, err := decodeLedgerHead(b.Get(keyLedgerHead))
	if err == nil && l.ids == nil {
		err = fmt.Errorf("%w: call ledger without its ids bucket", ErrDamaged)
	}
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", run, err)
	}
	l.h = h
	return l, nil
}

// newLedger creates run's empty ledger. A ledger already there belongs
// to no run (runs are created once): the store is damaged. (Not a
// refusal: the caller may have written; the transaction is rolled back.)
func newLedger(tx *bolt.Tx, run string) (*runLedger, error) {
	if tx.Bucket(bktCalls).Bucket([]byte(run)) != nil {
		return nil, fmt.Errorf("run %s: %w: a call ledger exists for a run being created", run, ErrDamaged)
	}
	b, err := tx.Bucket(bktCalls).CreateBucket([]byte(run))
	if err != nil {
		return nil, err
	}
	ids, err := b.CreateBucket(bktLedgerIDs)
	if err != nil {
		return nil, err
	}
	l := &runLedger{run: run, b: b, ids: ids}
	return l, l.saveHead()
}

func (l *runLedger) saveHead() error { return l.b.Put(keyLedgerHead, l.h.encode()) }

func (l *runLedger) get(id string) (callEntry, bool, error) {
	v := l.ids.Get([]byte(id))
	if v == nil {
		return callEntry{}, false, nil
	}
	e, err := decodeCallEntry(v)
	if err != nil {
		return callEntry{}, false, fmt.Errorf("run %s: call %s: %w", l.run, id, err)
	}
	return e, true, nil
}

func (l *runLedger) put(id string, e callEntry) error { return l.ids.Put([]byte(id), e.encode()) }

// each calls fn with every call, in id order.
func (l *runLedger) each(fn func(id string, e callEntry) error) error {
	return l.ids.ForEach(func(k, v []byte) error {
		e, err := decodeCallEntry(v)
		if err != nil {
			return fmt.Errorf("run %s: call %s: %w", l.run, k, err)
		}
		return fn(string(k), e)
	})
}

// call is e as the API reports it.
func (l *runLedger) call(id string, e callEntry) Call {
	return Call{ID: id, Kind: e.kind, Interval: e.interval, Payload: e.payload, State: e.state, Result: e.result,
		ResolvedIn: e.resolvedIn, Awaited: e.awaited && l.awaitKnown(), Open: e.interval > l.h.intervals}
}

func (l *runLedger) awaitKnown() bool { return l.h.intervals > 0 && l.h.awaitedIn == l.h.intervals }

// openLedger returns run's ledger for a write about its open interval
// (interval must be it, and the run executing) or, with last, about its
// last recorded interval; refusals are marked.
func openLedger(tx *bolt.Tx, run string, interval uint64, last bool) (*runLedger, error) {
	st, err := getState(tx, run)
	if err != nil {
		return nil, refuse(err)
	}
	l, err := ledgerOf(tx, run)
	if err == nil && l == nil {
		err = fmt.Errorf("run %s: %w", run, record.ErrClosed)
	}
	if err != nil {
		return nil, refuse(err)
	}
	switch {
	case interval == l.h.intervals+1 && st.phase == record.PhaseExecuting:
	case last && interval == l.h.intervals && interval > 0:
	default:
		return nil, refuse(fmt.Errorf("run %s: %w: interval %d (the run is %s with %d intervals recorded)", run, ErrInterval, interval, st.phase, l.h.intervals))
	}
	return l, nil
}

// writableLedger returns the ledger of run, refusing a closed run.
func writableLedger(tx *bolt.Tx, run string) (*runLedger, error) {
	if _, err := getState(tx, run); err != nil {
		return nil, refuse(err)
	}
	l, err := ledgerOf(tx, run)
	if err == nil && l == nil {
		err = fmt.Errorf("run %s: %w", run, record.ErrClosed)
	}
	if err != nil {
		return nil, refuse(err)
	}
	return l, nil
}

// update reads every one of ids (refusing an unknown one), lets fn change
// each (fn may refuse), and only then writes them.
func (l *runLedger) update(ids []string, fn func(i int, e *callEntry) error) error {
	es := make([]callEntry, len(ids))
	for i, id := range ids {
		e, ok, err := l.get(id)
		if err != nil {
			return refuse(err)
		}
		if !ok {
			return refuse(fmt.Errorf("run %s: call %s: %w", l.run, id, ErrUnknownCall))
		}
		es[i] = e
	}
	for i := range es {
		if err := fn(i, &es[i]); err != nil {
			return err
		}
	}
	for i, id := range ids {
		if err := l.put(id, es[i]); err != nil {
			return err
		}
	}
	return nil
}

func calls2ids(cs []Dispatch) []string {
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return ids
}

// checkCall refuses an id or kind a record or the protocol would not take.
func checkCall(id, kind string) error {
	if id == "" || len(id) > record.MaxCallIDLen || !utf8.ValidString(id) {
		return fmt.Errorf("%w: call id %q: want 1 to %d bytes of UTF-8", ErrCallID, id, record.MaxCallIDLen)
	}
	if len(kind) > maxKindLen || !utf8.ValidString(kind) {
		return fmt.Errorf("%w: call %s: kind of %d bytes: want at most %d bytes of UTF-8", ErrCallID, id, len(kind), maxKindLen)
	}
	return nil
}
