package store

import (
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// dispatch stores a call object for id and records the call in run's open
// interval n.
func dispatch(t *testing.T, s *Store, run string, n uint64, ids ...string) {
	t.Helper()
	var ds []Dispatch
	for _, id := range ids {
		ds = append(ds, Dispatch{ID: id, Kind: "build", Payload: put(t, s, `{"id":"`+id+`","kind":"build","payload":null}`)})
	}
	if err := s.Dispatched(run, n, ds...); err != nil {
		t.Fatal(err)
	}
}

// ledgerString is run's ledger, one call a field: id:state@interval, with
// /resolved-in, +result, *awaited, ?no call object and ~open.
func ledgerString(t *testing.T, s *Store, run string) string {
	t.Helper()
	l, err := s.Calls(run)
	if err != nil {
		t.Fatal(err)
	}
	out := fmt.Sprintf("n=%d", l.Intervals)
	if l.AwaitKnown {
		out += " await"
	}
	for _, c := range l.Calls {
		f := fmt.Sprintf("%s:%s@%d", c.ID, c.State, c.Interval)
		if c.ResolvedIn != 0 {
			f += fmt.Sprintf("/%d", c.ResolvedIn)
		}
		if !c.Result.IsZero() {
			f += "+"
		}
		if c.Awaited {
			f += "*"
		}
		if c.Payload.IsZero() {
			f += "?"
		}
		if c.Open {
			f += "~"
		}
		out += " " + f
	}
	return out
}

func wantLedger(t *testing.T, s *Store, run, want string) {
	t.Helper()
	if got := ledgerString(t, s, run); got != want {
		t.Fatalf("ledger of %s:\n got %s\nwant %s", run, got, want)
	}
}

// A transcript run's calls through two intervals: dispatched, posted,
// delivered, awaited, recorded with the park, posted while parked,
// delivered after the resume, and the ledger gone with the close.
func TestCallLedger(t *testing.T) {
	s := mustStore(t)
	h := mustCreate(t, s, "r")
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	wantLedger(t, s, "r", "n=0")
	dispatch(t, s, "r", 1, "c1", "c2", "c3")
	res1 := put(t, s, `{"ok":1}`)
	if err := s.Post("r", "c1", res1); err != nil {
		t.Fatal(err)
	}
	if err := s.Resolve("r", 1, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Await("r", 1, []string{"c2", "c3"}); err != nil {
		t.Fatal(err)
	}
	wantLedger(t, s, "r", "n=0 c1:resolved@1/1+~ c2:outstanding@1~ c3:outstanding@1~")
	if c, ok, err := s.Call("r", "c2"); err != nil || !ok || c.Kind != "build" || c.Interval != 1 || !c.Open {
		t.Fatalf("call c2: %+v %v %v", c, ok, err)
	}
	if _, ok, err := s.Call("r", "c9"); err != nil || ok {
		t.Fatalf("call c9: %v %v", ok, err)
	}
	ts := record.TranscriptSnapshot(tr)
	h = mustAppendAll(t, s, "r", h, record.Execution(att, &record.CallAccount{Dispatched: []string{"c1", "c2", "c3"}, Resolved: []string{"c1"}}),
		record.Suspension(ts, man))
	wantLedger(t, s, "r", "n=1 await c1:resolved@1/1 c2:outstanding@1* c3:outstanding@1*")
	out, err := s.Outstanding()
	if err != nil || len(out) != 2 || out[0].Run != "r" || out[0].ID != "c2" || out[0].Phase != record.PhaseParked || !out[0].Awaited {
		t.Fatalf("outstanding: %+v %v", out, err)
	}
	res2 := put(t, s, `{"ok":2}`)
	if err := s.Post("r", "c2", res2); err != nil {
		t.Fatal(err)
	}
	wantLedger(t, s, "r", "n=1 await c1:resolved@1/1 c2:posted@1+* c3:outstanding@1*")
	// GC keeps the objects a ledger names (c2's posted result) and lets
	// go of c1's, delivered and recorded: its bytes are in the journal.
	if _, err := s.GC(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if !s.Has(res2) || s.Has(res1) {
		t.Fatalf("after gc: posted result kept %v, delivered result kept %v", s.Has(res2), s.Has(res1))
	}
	res1 = put(t, s, `{"ok":4}`)
	h = mustAppendAll(t, s, "r", h, record.Resumption(ts, 5, record.Measured))
	if err := s.Resolve("r", 2, "c2"); err != nil {
		t.Fatal(err)
	}
	dispatch(t, s, "r", 2, "c4")
	wantLedger(t, s, "r", "n=1 await c1:resolved@1/1 c2:resolved@1/2+* c3:outstanding@1* c4:outstanding@2~")
	// No await in interval 2: after it is recorded no await is known.
	h = mustAppendAll(t, s, "r", h, record.Execution(att, &record.CallAccount{Dispatched: []string{"c4"}, Resolved: []string{"c2"}}))
	wantLedger(t, s, "r", "n=2 c1:resolved@1/1 c2:resolved@1/2 c3:outstanding@1 c4:outstanding@2")
	if err := s.Post("r", "c4", res1); err != nil {
		t.Fatal(err)
	}
	// The close removes the ledger: results posted and not delivered go
	// with it, and GC collects their objects.
	mustAppendAll(t, s, "r", h, record.Execution(att, &record.CallAccount{}), record.Closure("done"))
	if l, err := s.Calls("r"); err != nil || l.Intervals != 0 || len(l.Calls) != 0 {
		t.Fatalf("a closed run's ledger: %+v %v", l, err)
	}
	if out, err := s.Outstanding(); err != nil || len(out) != 0 {
		t.Fatalf("outstanding after the close: %+v %v", out, err)
	}
	if err := s.Post("r", "c3", res1); !errors.Is(err, record.ErrClosed) {
		t.Fatalf("a result for a closed run: %v", err)
	}
	if _, err := s.GC(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if s.Has(res1) || s.Has(res2) {
		t.Fatal("results of a closed run's ledger were kept")
	}
}

func mustAppendAll(t *testing.T, s *Store, run string, head record.Address, segs ...record.Segment) record.Address {
	t.Helper()
	h, err := s.AppendAll(run, head, segs...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Every refusal writes nothing.
func TestCallLedgerRefusals(t *testing.T) {
	s := mustStore(t)
	h := mustCreate(t, s, "r")
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	dispatch(t, s, "r", 1, "c1", "c2")
	res := put(t, s, `"result"`)
	if err := s.Post("r", "c1", res); err != nil {
		t.Fatal(err)
	}
	obj := put(t, s, "call")
	missing := record.Sum([]byte("not stored"))
	for _, c := range []struct {
		name string
		do   func() error
		want error
	}{
		{"dispatch in a closed interval", func() error { return s.Dispatched("r", 2, Dispatch{ID: "x", Payload: obj}) }, ErrInterval},
		{"dispatch of an id held", func() error { return s.Dispatched("r", 1, Dispatch{ID: "c2", Payload: obj}) }, ErrCallExists},
		{"dispatch of one id twice", func() error {
			return s.Dispatched("r", 1, Dispatch{ID: "x", Payload: obj}, Dispatch{ID: "x", Payload: obj})
		}, ErrCallExists},
		{"dispatch of no object", func() error { return s.Dispatched("r", 1, Dispatch{ID: "x", Payload: missing}) }, ErrMissingObject},
		{"dispatch of an empty id", func() error { return s.Dispatched("r", 1, Dispatch{Payload: obj}) }, ErrCallID},
		{"dispatch of a long kind", func() error {
			return s.Dispatched("r", 1, Dispatch{ID: "x", Kind: strings.Repeat("k", 257), Payload: obj})
		}, ErrCallID},
		{"dispatch in no run", func() error { return s.Dispatched("nosuch", 1, Dispatch{ID: "x", Payload: obj}) }, ErrNoRun},
		{"post for an unknown call", func() error { return s.Post("r", "c9", res) }, ErrUnknownCall},
		{"second post", func() error { return s.Post("r", "c1", res) }, ErrResultPosted},
		{"post of no object", func() error { return s.Post("r", "c2", missing) }, ErrMissingObject},
		{"resolve with no result", func() error { return s.Resolve("r", 1, "c1", "c2") }, ErrNoResult},
		{"resolve of an unknown call", func() error { return s.Resolve("r", 1, "c9") }, ErrUnknownCall},
		{"resolve in a closed interval", func() error { return s.Resolve("r", 0, "c1") }, ErrInterval},
		{"await of an unknown call", func() error { return s.Await("r", 1, []string{"c1", "c9"}) }, ErrUnknownCall},
		{"await in no recorded interval", func() error { return s.Await("r", 0, []string{"c1"}) }, ErrInterval},
		{"annotate an unknown call", func() error { return s.Annotate("r", Dispatch{ID: "c9", Payload: obj}) }, ErrUnknownCall},
	} {
		was := ledgerString(t, s, "r")
		if err := c.do(); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if now := ledgerString(t, s, "r"); now != was {
			t.Fatalf("%s changed the ledger: %s, was %s", c.name, now, was)
		}
	}
	if err := s.Resolve("r", 1, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Post("r", "c1", res); !errors.Is(err, ErrCallResolved) {
		t.Fatalf("post for a call delivered: %v", err)
	}
	if err := s.Resolve("r", 1, "c1"); !errors.Is(err, ErrCallResolved) {
		t.Fatalf("resolve twice: %v", err)
	}
	h = mustAppendAll(t, s, "r", h, record.Execution(att, &record.CallAccount{Dispatched: []string{"c1", "c2"}, Resolved: []string{"c1"}}),
		record.Suspension(record.TranscriptSnapshot(tr), man))
	// Parked: nothing is dispatched or delivered.
	if err := s.Dispatched("r", 2, Dispatch{ID: "x", Payload: obj}); !errors.Is(err, ErrInterval) {
		t.Fatalf("dispatch in a parked run: %v", err)
	}
	if err := s.Post("r", "c2", res); err != nil {
		t.Fatal(err)
	}
	if err := s.Resolve("r", 2, "c2"); !errors.Is(err, ErrInterval) {
		t.Fatalf("resolve in a parked run: %v", err)
	}
	if err := s.Post("r", "c1", res); !errors.Is(err, ErrCallResolved) {
		t.Fatalf("post for a call resolved on the record: %v", err)
	}
	// Held elsewhere: no result is taken.
	if err := s.HandOff("r", h); err != nil {
		t.Fatal(err)
	}
	if out, err := s.Outstanding(); err != nil || len(out) != 0 {
		t.Fatalf("a handed-off run's calls listed: %+v %v", out, err)
	}
	was := ledgerString(t, s, "r")
	if err := s.Post("r", "c2", res); !errors.Is(err, ErrHandedOff) {
		t.Fatalf("post to a handed-off run: %v", err)
	}
	if now := ledgerString(t, s, "r"); now != was {
		t.Fatalf("refused post changed the ledger: %s", now)
	}
}

// An interval recorded without an account (its channel died with a
// daemon) drops the calls dispatched in it and posts again the results
// delivered in it; an account that leaves out a call the ledger has in the
// open interval drops it too.
func TestCallLedgerUnaccounted(t *testing.T) {
	s := mustStore(t)
	h := mustCreate(t, s, "r")
	att := put(t, s, "att")
	h = mustAppendAll(t, s, "r", h, record.Execution(att, &record.CallAccount{Dispatched: []string{"old"}}))
	res := put(t, s, `"r"`)
	dispatch(t, s, "r", 2, "new")
	for _, id := range []string{"old", "new"} {
		if err := s.Post("r", id, res); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Resolve("r", 2, "old", "new"); err != nil {
		t.Fatal(err)
	}
	wantLedger(t, s, "r", "n=1 new:resolved@2/2+~ old:resolved@1/2+?")
	h = mustAppendAll(t, s, "r", h, record.Execution(att, nil))
	wantLedger(t, s, "r", "n=2 old:posted@1+?")
	dispatch(t, s, "r", 3, "new", "extra")
	mustAppendAll(t, s, "r", h, record.Execution(att, &record.CallAccount{Dispatched: []string{"new"}}))
	wantLedger(t, s, "r", "n=3 new:outstanding@3 old:posted@1+?")
}

// A record written elsewhere (imported, extended, or appended by a writer
// that does not dispatch through the ledger) gives the ledger its calls
// without kinds or call objects; Annotate fills them in, once.
func TestCallLedgerFromRecord(t *testing.T) {
	s := mustStore(t)
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	ts := record.TranscriptSnapshot(tr)
	u, g := unitOf("imported")
	r := record.New(u, g)
	for _, seg := range []record.Segment{
		record.Execution(att, &record.CallAccount{Dispatched: []string{"a", "b"}}),
		record.Suspension(ts, man), record.Resumption(ts, 1, record.Measured),
		record.Execution(att, &record.CallAccount{Dispatched: []string{"c"}, Resolved: []string{"a", "zz"}}),
		record.Suspension(ts, man),
	} {
		if _, err := r.Append(seg); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ImportAs("imported", r, false); err != nil {
		t.Fatal(err)
	}
	wantLedger(t, s, "imported", "n=2 a:resolved@1/2? b:outstanding@1? c:outstanding@2?")
	obj := put(t, s, "b's call")
	if err := s.Annotate("imported", Dispatch{ID: "b", Kind: "review", Payload: obj}); err != nil {
		t.Fatal(err)
	}
	if err := s.Annotate("imported", Dispatch{ID: "b", Kind: "other", Payload: put(t, s, "another")}); err != nil {
		t.Fatal(err)
	}
	if c, _, _ := s.Call("imported", "b"); c.Kind != "review" || c.Payload != obj {
		t.Fatalf("annotated: %+v", c)
	}
	if err := s.Await("imported", 2, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	wantLedger(t, s, "imported", "n=2 await a:resolved@1/2? b:outstanding@1* c:outstanding@2?")
	// An await naming nothing: known, and no call awaited.
	if err := s.Await("imported", 2, nil); err != nil {
		t.Fatal(err)
	}
	wantLedger(t, s, "imported", "n=2 await a:resolved@1/2? b:outstanding@1 c:outstanding@2?")

	// A closed record imported has no ledger; a copy's calls are not
	// listed; an extension folds in what it adds.
	closed := record.New(unitOf("closed"))
	for _, seg := range []record.Segment{record.Execution(att, &record.CallAccount{Dispatched: []string{"a"}}), record.Closure("x")} {
		if _, err := closed.Append(seg); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Import("closed", closed); err != nil {
		t.Fatal(err)
	}
	if l, err := s.Calls("closed"); err != nil || len(l.Calls) != 0 {
		t.Fatalf("closed import: %+v %v", l, err)
	}
	if err := s.HandOff("imported", r.Head()); err != nil {
		t.Fatal(err)
	}
	for _, seg := range []record.Segment{record.Resumption(ts, 1, record.Measured),
		record.Execution(att, &record.CallAccount{Dispatched: []string{"d"}, Resolved: []string{"b", "c"}}), record.Suspension(ts, man)} {
		if _, err := r.Append(seg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Extend("imported", r, false, false); err != nil {
		t.Fatal(err)
	}
	wantLedger(t, s, "imported", "n=3 a:resolved@1/2? b:resolved@1/3 c:resolved@2/3? d:outstanding@3?")
	if out, err := s.Outstanding(); err != nil || len(out) != 1 || out[0].ID != "d" || out[0].Kind != "" {
		t.Fatalf("outstanding: %+v %v", out, err)
	}
}

// Check verifies every ledger against its record: each damage below is
// ErrDamaged, and the store checks again once it is undone.
func TestCheckCallLedger(t *testing.T) {
	s := mustStore(t)
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	h := mustCreate(t, s, "parked")
	dispatch(t, s, "parked", 1, "c1", "c2")
	mustAppendAll(t, s, "parked", h, record.Execution(att, &record.CallAccount{Dispatched: []string{"c1", "c2"}}),
		record.Suspension(record.TranscriptSnapshot(tr), man))
	h = mustCreate(t, s, "closed")
	mustAppendAll(t, s, "closed", h, record.Closure("x"))
	res := put(t, s, "res")
	entry := func(e callEntry) func(tx *bolt.Tx) error {
		return func(tx *bolt.Tx) error {
			return tx.Bucket(bktCalls).Bucket([]byte("parked")).Bucket(bktLedgerIDs).Put([]byte("c9"), e.encode())
		}
	}
	for _, c := range []struct {
		name string
		edit func(tx *bolt.Tx) error
	}{
		{"a call the record did not dispatch", entry(callEntry{state: CallOutstanding, interval: 1})},
		{"a call of an open interval of a parked run", entry(callEntry{state: CallOutstanding, interval: 2})},
		{"a call dispatched in another interval", func(tx *bolt.Tx) error {
			return tx.Bucket(bktCalls).Bucket([]byte("parked")).Bucket(bktLedgerIDs).Put([]byte("c1"), callEntry{state: CallOutstanding, interval: 2}.encode())
		}},
		{"a call resolved the record does not resolve", func(tx *bolt.Tx) error {
			return tx.Bucket(bktCalls).Bucket([]byte("parked")).Bucket(bktLedgerIDs).Put([]byte("c1"), callEntry{state: CallResolved, interval: 1, resolvedIn: 1}.encode())
		}},
		{"a call missing", func(tx *bolt.Tx) error {
			return tx.Bucket(bktCalls).Bucket([]byte("parked")).Bucket(bktLedgerIDs).Delete([]byte("c2"))
		}},
		{"a wrong interval count", func(tx *bolt.Tx) error {
			return tx.Bucket(bktCalls).Bucket([]byte("parked")).Put(keyLedgerHead, ledgerHead{intervals: 2}.encode())
		}},
		{"a garbled entry", func(tx *bolt.Tx) error {
			return tx.Bucket(bktCalls).Bucket([]byte("parked")).Bucket(bktLedgerIDs).Put([]byte("c1"), []byte("garbage"))
		}},
		{"a closed run's ledger", func(tx *bolt.Tx) error {
			_, err := newLedger(tx, "closed")
			return err
		}},
		{"a ledger of no run", func(tx *bolt.Tx) error {
			_, err := newLedger(tx, "nosuch")
			return err
		}},
		{"an open run without a ledger", func(tx *bolt.Tx) error { return tx.Bucket(bktCalls).DeleteBucket([]byte("parked")) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			restore := snapshotCalls(t, s)
			if err := s.commit(c.edit); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Check(t.Context()); !errors.Is(err, ErrDamaged) {
				t.Errorf("Check: %v, want ErrDamaged", err)
			}
			restore()
			if _, err := s.Check(t.Context()); err != nil {
				t.Fatalf("after the damage was undone: %v", err)
			}
		})
	}
	// A posted result whose object is gone: Check rehashes what a
	// ledger names.
	if err := s.Post("parked", "c1", res); err != nil {
		t.Fatal(err)
	}
	damage(t, s, res, flipByte(0))
	if _, err := s.Check(t.Context()); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Check with a posted result damaged: %v", err)
	}
	damage(t, s, res, flipByte(0))
}

// snapshotCalls copies the calls bucket and returns a function that puts
// it back.
func snapshotCalls(t *testing.T, s *Store) func() {
	t.Helper()
	saved := map[string]map[string][]byte{} // run → key ("run" or "ids/<id>") → value
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktCalls).ForEachBucket(func(run []byte) error {
			m := map[string][]byte{}
			b := tx.Bucket(bktCalls).Bucket(run)
			m["run"] = append([]byte(nil), b.Get(keyLedgerHead)...)
			err := b.Bucket(bktLedgerIDs).ForEach(func(k, v []byte) error {
				m["ids/"+string(k)] = append([]byte(nil), v...)
				return nil
			})
			saved[string(run)] = m
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		err := s.commit(func(tx *bolt.Tx) error {
			if err := tx.DeleteBucket(bktCalls); err != nil {
				return err
			}
			calls, err := tx.CreateBucket(bktCalls)
			if err != nil {
				return err
			}
			for run, m := range saved {
				b, _ := calls.CreateBucket([]byte(run))
				ids, _ := b.CreateBucket(bktLedgerIDs)
				for k, v := range m {
					if id, ok := strings.CutPrefix(k, "ids/"); ok {
						ids.Put([]byte(id), v)
					} else {
						b.Put(keyLedgerHead, v)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Migration 5→6 gives every run that is not closed its ledger from its
// record; a closed run has none.
func TestMigrationCallLedger(t *testing.T) {
	att, tr, man := record.Sum([]byte("att")), record.Sum([]byte("transcript")), record.Sum([]byte("manifest"))
	ts := record.TranscriptSnapshot(tr)
	recs := recordsOf(t, map[string][]record.Segment{
		"fresh": nil,
		"parked": {record.Execution(att, &record.CallAccount{Dispatched: []string{"a", "b"}}), record.Suspension(ts, man),
			record.Resumption(ts, 1, record.Measured), record.Execution(att, &record.CallAccount{Dispatched: []string{"c"}, Resolved: []string{"a"}}),
			record.Suspension(ts, man)},
		"running":     {record.Execution(att, nil), record.Execution(att, &record.CallAccount{Dispatched: []string{"x"}})},
		"closed":      {record.Execution(att, &record.CallAccount{Dispatched: []string{"a"}}), record.Closure("done")},
		"image-units": {record.Execution(att, &record.CallAccount{}), record.Execution(att, &record.CallAccount{})},
	})
	dir := t.TempDir()
	writeV1(t, dir, recs, []string{"att", "transcript", "manifest"})
	s := mustOpen(t, dir)
	if v := schemaVersion(t, s); v != SchemaVersion {
		t.Fatalf("version %d", v)
	}
	for id, want := range map[string]string{
		"fresh":       "n=0",
		"parked":      "n=2 a:resolved@1/2? b:outstanding@1? c:outstanding@2?",
		"running":     "n=2 x:outstanding@2?",
		"closed":      "n=0",
		"image-units": "n=2",
	} {
		wantLedger(t, s, id, want)
	}
	// The migrated ledger works on.
	dispatch(t, s, "running", 3, "y")
	if err := s.Post("parked", "b", put(t, s, "res")); err != nil {
		t.Fatal(err)
	}
	s = mustReopen(t, s)
	wantLedger(t, s, "parked", "n=2 a:resolved@1/2? b:posted@1+? c:outstanding@2?")
}

// The ledger's bytes, pinned.
func TestCallLedgerBytes(t *testing.T) {
	e := callEntry{state: CallPosted, awaited: true, interval: 3, payload: record.Sum([]byte("call")), result: record.Sum([]byte("result")), kind: "build"}
	want := "01" + "02" + "01" + "0000000000000003" + "0000000000000000" +
		hex.EncodeToString(e.payload[:]) + hex.EncodeToString(e.result[:]) + "0005" + hex.EncodeToString([]byte("build"))
	if got := hex.EncodeToString(e.encode()); got != want {
		t.Fatalf("entry\n got %s\nwant %s", got, want)
	}
	if got, err := decodeCallEntry(e.encode()); err != nil || !reflect.DeepEqual(got, e) {
		t.Fatalf("decoded %+v %v", got, err)
	}
	h := ledgerHead{intervals: 2, awaitedIn: 2, open: 1}
	if got := hex.EncodeToString(h.encode()); got != "01"+"0000000000000002"+"0000000000000002"+"00000001" {
		t.Fatalf("head %s", got)
	}
	for name, b := range map[string][]byte{
		"short":                  e.encode()[:84],
		"outstanding, a result":  callEntry{state: CallOutstanding, interval: 1, result: e.result}.encode(),
		"posted, no result":      callEntry{state: CallPosted, interval: 1}.encode(),
		"resolved before sent":   callEntry{state: CallResolved, interval: 2, resolvedIn: 1}.encode(),
		"no interval":            callEntry{state: CallOutstanding}.encode(),
		"unknown state":          callEntry{state: 4, interval: 1}.encode(),
		"kind not UTF-8":         callEntry{state: CallOutstanding, interval: 1, kind: "\xff"}.encode(),
		"kind longer than given": append(callEntry{state: CallOutstanding, interval: 1, kind: "k"}.encode(), 'x'),
	} {
		if _, err := decodeCallEntry(b); !errors.Is(err, ErrDamaged) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzCallEntry(f *testing.F) {
	f.Add(callEntry{state: CallPosted, awaited: true, interval: 3, result: record.Sum([]byte("r")), kind: "build"}.encode())
	f.Add(callEntry{state: CallResolved, interval: 1, resolvedIn: 2}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeCallEntry(b)
		if err != nil {
			return
		}
		if again := e.encode(); string(again) != string(b) {
			t.Fatalf("decoded entry does not re-encode to its bytes: %x", again)
		}
	})
}

// The ledger follows appends made concurrently with dispatches and posts
// to other runs (group commit): every run's ledger checks.
func TestCallLedgerConcurrent(t *testing.T) {
	s := mustStore(t)
	att := put(t, s, "att")
	done := make(chan error)
	for i := range 8 {
		go func() {
			run := fmt.Sprintf("r%d", i)
			h, err := s.Create(run, record.Sum([]byte(run)), record.Sum([]byte("g")))
			for n := uint64(1); err == nil && n <= 5; n++ {
				id := fmt.Sprintf("c%d", n)
				var obj record.Address
				if obj, err = s.PutBytes([]byte(run + id)); err != nil {
					break
				}
				if err = s.Dispatched(run, n, Dispatch{ID: id, Payload: obj}); err != nil {
					break
				}
				if err = s.Post(run, id, obj); err != nil {
					break
				}
				h, err = s.Append(run, h, record.Execution(att, &record.CallAccount{Dispatched: []string{id}}))
			}
			done <- err
		}()
	}
	deadline := time.After(time.Minute)
	for range 8 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("stuck")
		}
	}
	wantLedger(t, s, "r3", "n=5 c1:posted@1+ c2:posted@2+ c3:posted@3+ c4:posted@4+ c5:posted@5+")
}
