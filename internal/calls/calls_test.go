package calls

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

func mustDispatch(t *testing.T, ch *Channel, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := ch.Dispatch(t.Context(), protocol.Call{ID: id, Kind: "build", Payload: json.RawMessage(`{"n":"` + id + `"}`)}); err != nil {
			t.Fatal(err)
		}
	}
}

func mustPost(t *testing.T, st Store, run, call, payload string) {
	t.Helper()
	if err := Post(st, run, call, []byte(payload)); err != nil {
		t.Fatal(err)
	}
}

func wantAwaiting(t *testing.T, st Store, run string, want ...string) {
	t.Helper()
	got, err := Awaiting(st, run)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("awaiting %q, %v; want %q", got, err, want)
	}
}

// listed is GET /v1/calls for run as run/id:kind=payload, with + for a
// result posted.
func listed(t *testing.T, st Store) string {
	t.Helper()
	ls, err := List(st)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		s := fmt.Sprintf("%s/%s(%s):%s=%s", l.Run, l.ID, l.Phase, l.Kind, l.Payload)
		if l.ResultPosted {
			s += "+"
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// A run's calls through park and resume: dispatched and listed with their
// payloads, awaited (the run parks), posted one by one — the await
// completes only with the last it named — then delivered to the next
// interval and resolved by its account, and listed no more.
func TestDispatchAwaitPostResolve(t *testing.T) {
	ctx := t.Context()
	st := mustStore(t)
	newRun(t, st, "r")
	ch, h := openChannel(t, st, "r", unit.Limits{}, nil)
	mustDispatch(t, ch, "c1", "c2", "c3")
	if got := listed(t, st); got != `r/c1(executing):build={"n":"c1"} r/c2(executing):build={"n":"c2"} r/c3(executing):build={"n":"c3"}` {
		t.Fatalf("listed %s", got)
	}
	// c3's result comes at once; the unit polls it in the interval.
	mustPost(t, st, "r", "c3", `{"r":3}`)
	if r, ok, err := ch.Result(ctx, "c3"); err != nil || !ok || string(r.Payload) != `{"r":3}` {
		t.Fatalf("result c3: %+v %v %v", r, ok, err)
	}
	if err := Post(st, "r", "c3", []byte(`{}`)); !errors.Is(err, ErrRefused) {
		t.Fatalf("a result for a call delivered: %v", err)
	}
	if parking, err := ch.Await(ctx, []string{"c3"}); err != nil || parking {
		t.Fatalf("await of a call delivered: %v %v", parking, err)
	}
	if parking, err := ch.Await(ctx, []string{"c1", "c2"}); err != nil || !parking {
		t.Fatalf("await: %v %v", parking, err)
	}
	if _, awaiting := h.said(); awaiting != 1 {
		t.Fatalf("the host was asked to park %d times", awaiting)
	}
	snap := park(t, st, "r", ch)
	if got := listed(t, st); got != `r/c1(parked):build={"n":"c1"} r/c2(parked):build={"n":"c2"}` {
		t.Fatalf("listed %s", got)
	}
	wantAwaiting(t, st, "r", "c1", "c2")
	mustPost(t, st, "r", "c2", `{"r":2}`)
	wantAwaiting(t, st, "r", "c1")
	mustPost(t, st, "r", "c1", `{"r":1}`)
	wantAwaiting(t, st, "r")
	if got := listed(t, st); got != `r/c1(parked):build={"n":"c1"}+ r/c2(parked):build={"n":"c2"}+` {
		t.Fatalf("listed %s", got)
	}
	if held, err := Held(st, "r"); err != nil || !slices.Equal(held, []string{"c1", "c2"}) {
		t.Fatalf("held %v %v", held, err)
	}

	// The resume: the next interval is delivered both, in id order.
	appendSegs(t, st, "r", record.Resumption(snap, 1, record.Estimated))
	ch, _ = openChannel(t, st, "r", unit.Limits{}, snap.Transcript)
	rs, err := ch.Results(ctx)
	if err != nil || len(rs) != 2 || rs[0].ID != "c1" || string(rs[1].Payload) != `{"r":2}` {
		t.Fatalf("results %+v %v", rs, err)
	}
	if r, ok, err := ch.Result(ctx, "c1"); err != nil || !ok || string(r.Payload) != `{"r":1}` {
		t.Fatalf("result c1 again: %+v %v %v", r, ok, err)
	}
	if _, _, err := ch.Result(ctx, "c3"); !errors.Is(err, protocol.ErrResolved) {
		t.Fatalf("result of a call resolved in an earlier interval: %v", err)
	}
	if got := listed(t, st); got != "" {
		t.Fatalf("listed after delivery %s", got)
	}
	if a := ch.Account(); len(a.Dispatched) != 0 || !slices.Equal(a.Resolved, []string{"c1", "c2"}) {
		t.Fatalf("account %+v", a)
	}
	park(t, st, "r", ch)
	l, _ := st.Calls("r")
	for _, c := range l.Calls {
		if c.State != store.CallResolved || !c.Result.IsZero() {
			t.Fatalf("after the second park: %+v", c)
		}
	}
}

// Duplicate and unknown calls are refused, by the channel with their
// protocol codes and by Post with ErrRefused, and change nothing.
func TestDuplicateAndUnknownCalls(t *testing.T) {
	ctx := t.Context()
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{}, nil)
	mustDispatch(t, ch, "c1", "c2")
	mustPost(t, st, "r", "c2", `2`)
	if _, err := ch.Results(ctx); err != nil {
		t.Fatal(err)
	}
	snap := park(t, st, "r", ch)
	appendSegs(t, st, "r", record.Resumption(snap, 1, record.Estimated))
	ch, _ = openChannel(t, st, "r", unit.Limits{}, snap.Transcript)
	before := listed(t, st)
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"dispatch of an earlier interval's call", ch.Dispatch(ctx, protocol.Call{ID: "c1", Kind: "k"}), protocol.ErrDuplicateCall},
		{"dispatch of a resolved call", ch.Dispatch(ctx, protocol.Call{ID: "c2", Kind: "k"}), protocol.ErrDuplicateCall},
		{"await of an unknown call", second(ch.Await(ctx, []string{"c1", "c9"})), protocol.ErrUnknownCall},
		{"await of a resolved call", second(ch.Await(ctx, []string{"c2"})), protocol.ErrResolved},
		{"result of an unknown call", third(ch.Result(ctx, "c9")), protocol.ErrUnknownCall},
		{"post for an unknown call", Post(st, "r", "c9", []byte(`1`)), ErrRefused},
		{"post for a resolved call", Post(st, "r", "c2", []byte(`1`)), ErrRefused},
		{"post of no JSON", Post(st, "r", "c1", []byte(`{`)), ErrNotJSON},
		{"post to no run", Post(st, "nosuch", "c1", []byte(`1`)), store.ErrNoRun},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	mustPost(t, st, "r", "c1", `1`)
	if err := Post(st, "r", "c1", []byte(`2`)); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already posted") {
		t.Fatalf("a second result: %v", err)
	}
	mustDispatch(t, ch, "c3")
	if err := ch.Dispatch(ctx, protocol.Call{ID: "c3", Kind: "k"}); !errors.Is(err, protocol.ErrDuplicateCall) {
		t.Fatalf("a second dispatch in one interval: %v", err)
	}
	if after := listed(t, st); after != before+"+ "+`r/c3(executing):build={"n":"c3"}` {
		t.Fatalf("listed %s, before %s", after, before)
	}
}

func second(_ bool, err error) error { return err }

func third(_ protocol.Result, _ bool, err error) error { return err }

// An interval whose channel died with the daemon is recorded without an
// account: the calls it dispatched leave the ledger (the record does not
// have them), so the unit, restarted from its transcript, dispatches them
// again; a result delivered in it is posted again, for the next interval.
func TestUnaccountedInterval(t *testing.T) {
	ctx := t.Context()
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{}, nil)
	mustDispatch(t, ch, "old")
	snap := park(t, st, "r", ch)
	appendSegs(t, st, "r", record.Resumption(snap, 1, record.Estimated))
	mustPost(t, st, "r", "old", `"o"`)
	ch, _ = openChannel(t, st, "r", unit.Limits{}, snap.Transcript)
	mustDispatch(t, ch, "new")
	if rs, err := ch.Results(ctx); err != nil || len(rs) != 1 {
		t.Fatalf("results %+v %v", rs, err)
	}
	ch.Stop() // the daemon dies; the next one records the interval unaccounted
	appendSegs(t, st, "r", record.Execution(attestation(t, st, ch), nil), record.Suspension(snap, put(t, st, "manifest")))
	if got := listed(t, st); got != `r/old(parked):build={"n":"old"}+` {
		t.Fatalf("listed %s", got)
	}
	appendSegs(t, st, "r", record.Resumption(snap, 1, record.Estimated))
	ch, _ = openChannel(t, st, "r", unit.Limits{}, snap.Transcript)
	mustDispatch(t, ch, "new")
	if rs, err := ch.Results(ctx); err != nil || len(rs) != 1 || rs[0].ID != "old" {
		t.Fatalf("results after the recovery %+v %v", rs, err)
	}
}

// A result posted and not yet delivered survives a restart of the
// daemon: it is in the ledger, and the run's next interval, on the
// restarted daemon, is delivered it.
func TestPostedResultSurvivesRestart(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{}, nil)
	mustDispatch(t, ch, "c1")
	if parking, err := ch.Await(ctx, []string{"c1"}); err != nil || !parking {
		t.Fatal(parking, err)
	}
	snap := park(t, st, "r", ch)
	mustPost(t, st, "r", "c1", `{"done":true}`)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = mustOpenStore(t, dir)
	wantAwaiting(t, st, "r")
	appendSegs(t, st, "r", record.Resumption(snap, 1, record.Estimated))
	ch, _ = openChannel(t, st, "r", unit.Limits{}, snap.Transcript)
	if rs, err := ch.Results(ctx); err != nil || len(rs) != 1 || string(rs[0].Payload) != `{"done":true}` {
		t.Fatalf("results after the restart %+v %v", rs, err)
	}
}

// A run closed with results posted and not delivered takes no more; its
// calls are listed no more, and their objects are let go.
func TestClosedWithResultsPending(t *testing.T) {
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{}, nil)
	mustDispatch(t, ch, "c1", "c2")
	park(t, st, "r", ch)
	mustPost(t, st, "r", "c1", `"pending"`)
	c1, _, _ := st.Call("r", "c1")
	appendSegs(t, st, "r", record.Closure("closed by request"))
	if got := listed(t, st); got != "" {
		t.Fatalf("listed %s", got)
	}
	if err := Post(st, "r", "c2", []byte(`1`)); !errors.Is(err, record.ErrClosed) {
		t.Fatalf("a result for a closed run: %v", err)
	}
	if w, err := Awaiting(st, "r"); err != nil || len(w) != 0 {
		t.Fatalf("a closed run awaits %v %v", w, err)
	}
	if _, err := st.GC(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if st.Has(c1.Result) || st.Has(c1.Payload) {
		t.Fatal("the closed run's result and call objects were kept")
	}
}

// A run held elsewhere is not listed here: its calls are awaited where
// it lives.
func TestHandedOffNotListed(t *testing.T) {
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{}, nil)
	mustDispatch(t, ch, "c1")
	park(t, st, "r", ch)
	h, _ := st.Head("r")
	if err := st.HandOff("r", h); err != nil {
		t.Fatal(err)
	}
	if got := listed(t, st); got != "" {
		t.Fatalf("listed %s", got)
	}
	if err := Post(st, "r", "c1", []byte(`1`)); !errors.Is(err, store.ErrHandedOff) {
		t.Fatalf("post to a handed-off run: %v", err)
	}
}
