package member

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// slabbed stores in m's store run "s", an image run parked once whose
// memory image holds a pages file in the slab form, and claims it for
// session h: a run a post-copy target may take owing its slabs.
func slabbed(t *testing.T, m *Member, h *fleet.Session) *record.Record {
	t.Helper()
	return slabbedOwing(t, m, h, nil)
}

// slabbedOwing is slabbed; with o not nil, the run is stored owing its
// slab from o.Source (o's slabs, listings and head filled in).
func slabbedOwing(t *testing.T, m *Member, h *fleet.Session, o *store.Owing) *record.Record {
	t.Helper()
	return slabbedOwingOf(t, m, h, o, bytes.Repeat([]byte{'a'}, 16<<10))
}

// slabbedOwingOf is slabbedOwing whose memory image has one slab per
// chunk given (each one chunk), all owed.
func slabbedOwingOf(t *testing.T, m *Member, h *fleet.Session, o *store.Owing, chunks ...[]byte) *record.Record {
	t.Helper()
	st := m.cfg.Store
	put := func(b []byte, refs ...record.Address) record.Address {
		a, err := st.PutBytes(b, refs...)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	ingest := func(files map[string][]byte) record.Address {
		dir, err := st.StagingDir("test")
		if err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			p := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		a, _, err := st.Ingest(t.Context(), dir)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	var idx []store.SlabChunk
	var owed []record.Address
	files := map[string][]byte{"core-1.img": []byte("core")}
	for i, chunk := range chunks {
		idx = append(idx, store.SlabChunk{Vaddr: 0x10000 + uint64(i)<<20, Size: uint64(len(chunk)), Slab: i, Offset: 0, Address: record.Sum(chunk)})
		owed = append(owed, record.Sum(chunk))
		files[store.SlabName("pages-1.img", i)] = chunk
	}
	files["pages-1.img.slabs/index"] = store.EncodeSlabIndex(idx)
	root := ingest(map[string][]byte{"rootfs/etc/x": []byte("x")})
	memory := ingest(files)
	sp := unit.Spec{Image: "example/unit:2", ImageDigest: "sha256:" + strings.Repeat("b", 64), Mode: unit.ImageMode, Args: []string{"s"}}
	sc, err := sp.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := (&attest.Receipt{Provenance: record.Estimated, Method: "test", WindowNS: 1}).Canonical()
	var j attest.Journal
	rca, ja := put(rc), put(j.Encode())
	man := manifest.Manifest{}
	for _, k := range manifest.ImageKeys {
		man[k] = "x"
	}
	mc, _ := man.Canonical()
	g := unit.Grants{Network: unit.NoNetwork}
	rec := record.New(put(sc), put(g.Encode()))
	susp := record.Suspension(record.ImageSnapshot(root, &memory), put(mc))
	c, _ := susp.Canonical()
	sig, err := attest.Sign(&attest.Body{Genesis: rec.Genesis(), Interval: 1, PrevHead: rec.Head(), StartNS: 1, EndNS: 2,
		Receipt: rca, Journal: ja, Outcome: attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}}, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, seg := range []record.Segment{record.Execution(put(sig.Encode(), rca, ja), nil), susp} {
		if _, err := rec.Append(seg); err != nil {
			t.Fatal(err)
		}
	}
	if o == nil {
		err = st.Import("s", rec)
	} else {
		o.Head, o.Slabs, o.Listings = rec.Head(), owed, []record.Address{memory}
		err = st.ImportOwing("s", rec, false, *o)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Claim(t.Context(), rec.Genesis(), "s", rec.Head(), record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	return rec
}

// A source holds a parked slabbed run for its target, and says so in the
// hand-over (Handed.Held), only when the target's offer says it takes runs
// post-copy: a target that does not (an older host, whose decoder refuses
// a field it does not know) gets no held field, and no hold is made here.
// Seen failing first: the hold made and held sent whatever the offer.
func TestHoldOnlyForPostCopyTarget(t *testing.T) {
	for _, offers := range []bool{false, true} {
		c := etcdtest.Shared(t)
		dir := fleet.New(c.Client(t), fmt.Sprintf("/hold-offered-%v/", offers), 5*time.Second)
		a, b := join(t, dir, "a"), join(t, dir, "b")
		p := &peers{postCopy: offers}
		m, st, _, _ := room(t, a, p)
		slabbed(t, m, a)
		holding := false
		p.onHand = func() { _, holding, _ = st.HoldOf("s") }
		if err := m.migrate(t.Context(), "s", b.Key(), func() (Held, func(), error) { return &parked{}, func() {}, nil }, nil); err != nil {
			t.Fatal(err)
		}
		if p.last.Held != offers || holding != offers {
			t.Fatalf("a target offering post-copy %v: held sent %v, a hold made %v", offers, p.last.Held, holding)
		}
	}
}

// A hold outlives no reason (seen failing first, each): a hold on a run
// not handed off here (the source stopped after AddHold, and the run was
// taken back) ends at the next start, while a handed-off run's stays; a
// store that cannot say whether the run is handed off keeps the hold.
func TestHoldEndsWithItsReason(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/hold-reason/", 5*time.Second)
	a := join(t, dir, "a")
	m, st, _, rec := room(t, a, &peers{})
	srec := slabbed(t, m, a)
	target := record.Sum([]byte("target"))
	if err := st.HandOff("s", srec.Head()); err != nil {
		t.Fatal(err)
	}
	for id, head := range map[string]record.Address{"r": rec.Head(), "s": srec.Head()} {
		if err := st.AddHold(id, target, head); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.GoOn(); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.HoldOf("r"); ok {
		t.Fatal("a hold on a run not handed off outlived a start")
	}
	if _, ok, _ := st.HoldOf("s"); !ok {
		t.Fatal("a handed-off run's hold ended at a start")
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if !m.stillHanded("s") {
		t.Fatal("a store not read says the run is not handed off: its hold would end")
	}
	if _, err := m.Owing("s"); err == nil {
		t.Fatal("a store not read says the run owes nothing")
	}
}

// A target that holds every slab of a run it has since handed onward
// (before its source was told) still tells the source, then ends the
// owing: the source's hold ends. Seen failing first: abandoned untold.
func TestPaidRunHandedOnwardTellsItsSource(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/paid-onward/", 5*time.Second)
	a := join(t, dir, "a")
	p := &peers{}
	m, st, _, _ := room(t, a, p)
	source := record.Sum([]byte("source"))
	o := &store.Owing{Source: source}
	rec := slabbedOwing(t, m, a, o)
	if err := st.Settle(t.Context(), "s", o.Slabs[0]); err != nil {
		t.Fatal(err)
	}
	if err := st.HandOff("s", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := m.payOnce(t.Context(), "s"); err != nil {
		t.Fatal(err)
	}
	if p.done.Load() != 1 {
		t.Fatalf("the source told %d times", p.done.Load())
	}
	if _, ok, _ := st.Owed("s"); ok {
		t.Fatal("the owing stays")
	}
}

// A post-copy target's done is a peer's request: only the hold's target,
// naming the genesis and head the run was handed over at, ends the hold
// (and the objects it served); any other is refused ErrUnsolicited,
// the hold and its serving left as they were. A done with no hold is a
// no-op. Seen failing first with Done not comparing the head.
func TestDoneEndsOnlyItsTargetsHold(t *testing.T) {
	m, st, rec, target, other := heldRun(t, "/postcopy-done/")
	if err := m.GoOn(); err != nil {
		t.Fatal(err)
	}
	if err := m.ServesRecord(target, "r"); err != nil {
		t.Fatalf("a held run is not served to its target after a start: %v", err)
	}
	if err := m.ServesRecord(other, "r"); !errors.Is(err, ErrUnsolicited) {
		t.Fatalf("a held run served to another host: %v", err)
	}
	for _, bad := range []struct {
		name string
		key  record.Address
		h    Handed
	}{
		{"another host", other, Handed{Run: "r", Genesis: rec.Genesis(), Head: rec.Head()}},
		{"another head", target, Handed{Run: "r", Genesis: rec.Genesis(), Head: record.Sum([]byte("head"))}},
		{"another genesis", target, Handed{Run: "r", Genesis: record.Sum([]byte("genesis")), Head: rec.Head()}},
	} {
		if err := m.Done(bad.key, bad.h); !errors.Is(err, ErrUnsolicited) {
			t.Fatalf("done from %s: %v, want ErrUnsolicited", bad.name, err)
		}
		if _, ok, _ := st.HoldOf("r"); !ok {
			t.Fatalf("done from %s ended the hold", bad.name)
		}
	}
	if err := m.Done(target, Handed{Run: "r", Genesis: rec.Genesis(), Head: rec.Head()}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.HoldOf("r"); ok {
		t.Fatal("the target's done left the hold")
	}
	if err := m.ServesRecord(target, "r"); !errors.Is(err, ErrUnsolicited) {
		t.Fatalf("served after done: %v", err)
	}
	if err := m.Done(target, Handed{Run: "r", Genesis: rec.Genesis(), Head: rec.Head()}); err != nil {
		t.Fatalf("a second done: %v", err)
	}
	if hs, err := m.WaitHolds(t.Context()); err != nil || len(hs) != 0 {
		t.Fatalf("holds left: %v, %v", hs, err)
	}
}

// A post-copy target owes slabs only to a source that says it holds the
// run for it (Handed.Held): one that does not (an older source) stops
// serving the run's objects once the hand-over answers.
func TestOweOnlyWhenHeld(t *testing.T) {
	_, _, b, _, rec := handedOver(t, "/owe-held/")
	p := &peers{}
	m, _, _ := receiver(t, b, p)
	m.cfg.PostCopy = true
	for _, held := range []bool{false, true} {
		h := handed(rec, false)
		h.Held = held
		_, _, _ = m.fetch(t.Context(), b.Key(), h)
	}
	if !slices.Equal(p.owe, []bool{false, true}) {
		t.Fatalf("fetches owing %v for a source not holding the run, then holding it; want [false true]", p.owe)
	}
}

// A resume waiting for a run's slabs while another fetch of them holds
// the run's turn gives up when its context ends (seen failing first: it
// waited on the fetch).
func TestPayWaitEndsWithItsContext(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/pay-wait/", 5*time.Second)
	a := join(t, dir, "a")
	m, _, _, _ := room(t, a, &peers{})
	slabbedOwing(t, m, a, &store.Owing{Source: record.Sum([]byte("source"))})
	p, release := m.paying.acquire("s")
	defer release()
	if err := p.lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer p.unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	go func() { got <- m.Pay(ctx, "s") }()
	select {
	case err := <-got:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("pay: %v, want its context's end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pay still waits 10 s on after its context ended")
	}
}

// The fetch of a run's owed slabs checks the store's free space before
// each slab: with less than the slab past --min-free it is refused
// (transfer.ErrNoSpace), to be tried again later, nothing fetched (seen
// failing first: the slab was fetched).
func TestFillKeepsMinFree(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/fill-free/", 5*time.Second)
	a := join(t, dir, "a")
	p := &peers{}
	m, st, _, _ := room(t, a, p)
	p.from = st
	o := &store.Owing{Source: record.Sum([]byte("source"))}
	slabbedOwing(t, m, a, o)
	if err := os.Remove(st.Path(o.Slabs[0])); err != nil { // not here yet
		t.Fatal(err)
	}
	m.cfg.MinFree = 1 << 62
	if err := m.payOnce(t.Context(), "s"); !errors.Is(err, transfer.ErrNoSpace) {
		t.Fatalf("a fill past the minimum free space: %v, want ErrNoSpace", err)
	}
	if err := st.Owes("s"); !errors.Is(err, store.ErrOwed) {
		t.Fatalf("owing: %v", err)
	}
}

// A host that still owes slabs of a run does not hand it on (its fill
// would stop, and the next target would owe slabs nobody fetches): the
// migration is refused store.ErrOwed (unavailable) before anything
// changes, the target not even asked for its offer, the run not parked,
// transferred nor handed off. Seen failing first: the target's offer was
// asked, and an executing run parked, before the refusal.
func TestMigrateRefusesOwingRun(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/migrate-owing/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	p := &peers{postCopy: true}
	m, st, _, _ := room(t, a, p)
	rec := slabbedOwing(t, m, a, &store.Owing{Source: record.Sum([]byte("source"))})
	run := &parked{executing: true}
	err := m.migrate(t.Context(), "s", b.Key(), func() (Held, func(), error) { return run, func() {}, nil }, nil)
	if !errors.Is(err, store.ErrOwed) {
		t.Fatalf("migrating an owing run: %v, want ErrOwed", err)
	}
	if n, parks := p.offered.Load(), run.parks.Load(); n != 0 || parks != 0 {
		t.Fatalf("before the refusal: %d offers asked, %d parks", n, parks)
	}
	if _, off, _ := st.HandedOff("s"); off {
		t.Fatal("the owing run is handed off")
	}
	if e, err := a.Run(t.Context(), rec.Genesis()); err != nil || e.To != (record.Address{}) {
		t.Fatalf("the owing run's entry: %+v, %v", e, err)
	}
}

// A start serves a held run to its target only at the head the hold was
// made at: a hold whose run is handed off here at another head (it came
// back and left again since) is stale, and ends unserved. Seen failing
// first: the target was granted the run's current record.
func TestGoOnGrantsOnlyAtTheHoldsHead(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/goon-head/", 5*time.Second)
	a := join(t, dir, "a")
	m, st, _, rec := room(t, a, &peers{})
	target := record.Sum([]byte("target"))
	if err := st.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := st.AddHold("r", target, record.Sum([]byte("an older head"))); err != nil {
		t.Fatal(err)
	}
	if err := m.GoOn(); err != nil {
		t.Fatal(err)
	}
	if err := m.ServesRecord(target, "r"); !errors.Is(err, ErrUnsolicited) {
		t.Fatalf("a stale hold's target served the run: %v", err)
	}
	if _, ok, _ := st.HoldOf("r"); ok {
		t.Fatal("the stale hold stays")
	}
}

// A hold ends HoldLife after it was made, logged, though its target never
// said it holds the run: it pins the run's snapshots and serves its
// objects no longer. A younger hold stays. Seen failing first: holds never
// ended.
func TestHoldsExpire(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/hold-expiry/", 5*time.Second)
	a := join(t, dir, "a")
	m, st, _, rec := room(t, a, &peers{})
	var logged bytes.Buffer
	m.cfg.Log = slog.New(slog.NewTextHandler(&logged, nil))
	target := record.Sum([]byte("target"))
	if err := st.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := st.AddHold("r", target, rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := m.GoOn(); err != nil {
		t.Fatal(err)
	}
	m.expireHolds(time.Now().Add(HoldLife / 2))
	if _, ok, _ := st.HoldOf("r"); !ok {
		t.Fatal("a young hold ended")
	}
	m.expireHolds(time.Now().Add(HoldLife + time.Minute))
	if _, ok, _ := st.HoldOf("r"); ok {
		t.Fatal("an expired hold stays")
	}
	if err := m.ServesRecord(target, "r"); !errors.Is(err, ErrUnsolicited) {
		t.Fatalf("an expired hold's run served: %v", err)
	}
	if !strings.Contains(logged.String(), "hold expired") {
		t.Fatalf("no log line: %q", logged.String())
	}
}

// A resume's wait for a run's slabs ends with its request, and the fetch
// it waited on goes on in the background to the end: the run then holds
// every slab and its source is told. Seen failing first: the fetch ran on
// the request's context and stopped half-way with it.
func TestPayCancelledFetchGoesOn(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/pay-goes-on/", 5*time.Second)
	a := join(t, dir, "a")
	p := &peers{}
	m, st, _, _ := room(t, a, p)
	o := &store.Owing{Source: record.Sum([]byte("source"))}
	slabbedOwing(t, m, a, o)
	src, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	b, err := st.ReadAll(o.Slabs[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.PutBytes(b); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(st.Path(o.Slabs[0])); err != nil { // not here yet
		t.Fatal(err)
	}
	p.from = src
	entered, open := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.gate = func(r *http.Request) {
		once.Do(func() { close(entered) })
		select {
		case <-open:
		case <-r.Context().Done():
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan error, 1)
	go func() { got <- m.Pay(ctx, "s") }()
	<-entered
	cancel()
	if err := <-got; err == nil {
		t.Fatal("a pay whose request ended says the run holds its slabs")
	}
	close(open)
	deadline := time.Now().Add(10 * time.Second)
	for st.Owes("s") != nil || p.done.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the fetch did not go on: owes %v, source told %d times", st.Owes("s"), p.done.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A run's payer is dropped once no fetch of it is under way and no one
// waits on it: payers do not grow with every run ever received. Seen
// failing first: the payer stayed.
func TestPayersPruned(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/payers-pruned/", 5*time.Second)
	a := join(t, dir, "a")
	m, st, _, _ := room(t, a, &peers{})
	o := &store.Owing{Source: record.Sum([]byte("source"))}
	rec := slabbedOwing(t, m, a, o)
	if err := st.Settle(t.Context(), "s", o.Slabs[0]); err != nil {
		t.Fatal(err)
	}
	if err := st.HandOff("s", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := m.payOnce(t.Context(), "s"); err != nil {
		t.Fatal(err)
	}
	if n := payersLeft(m); n != 0 {
		t.Fatalf("%d payers left", n)
	}
}

// Once the member is closed, a background fetch is not started (its
// WaitGroup's Wait is under way or over): payLater says so. Seen failing
// first: it started one.
func TestPayLaterAfterCloseStartsNothing(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/paylater-closed/", 5*time.Second)
	a := join(t, dir, "a")
	m, _, _, _ := room(t, a, &peers{})
	slabbedOwing(t, m, a, &store.Owing{Source: record.Sum([]byte("source"))})
	if err := m.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if m.payLater("s") {
		t.Fatal("a background fetch started after Close")
	}
}

// A receive's room (FetchOptions.Free) leaves out what the store already
// owes post-copy migrations: the slabs owed to runs stored here, and to
// receives fetched and not stored yet. Seen failing first: the room was
// the filesystem's whole (no Free given).
func TestReceiveRoomLeavesOutOwed(t *testing.T) {
	_, _, b, _, rec := handedOver(t, "/receive-room/")
	p := &peers{}
	m, _, _ := receiver(t, b, p)
	_, _, _ = m.fetch(t.Context(), b.Key(), handed(rec, false))
	if p.free == nil {
		t.Fatal("no room given to the fetch")
	}
	if n, err := p.free(); err != nil || n == 0 {
		t.Fatalf("room %d: %v", n, err)
	}
	m.arriving.Add(1 << 62)
	if n, err := p.free(); err != nil || n != 0 {
		t.Fatalf("room %d owing 2^62 bytes: %v", n, err)
	}
}

// A run closed while it owes slabs is never resumed: the fetch's next try
// ends its owing (its source told, so that its hold ends) even though the
// source cannot serve the slabs, and retention may then release it. Seen
// failing first: the try failed on the source and the owing stayed, the
// closed run kept by retention and tried again for ever.
func TestClosedRunOwesNothing(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/closed-owing/", 5*time.Second)
	a := join(t, dir, "a")
	p := &peers{} // its Source fails: the source is gone
	m, st, _, _ := room(t, a, p)
	rec := slabbedOwing(t, m, a, &store.Owing{Source: record.Sum([]byte("source"))})
	if _, err := st.Append("s", rec.Head(), record.Closure("closed by request")); err != nil {
		t.Fatal(err)
	}
	if err := m.payOnce(t.Context(), "s"); err != nil {
		t.Fatalf("a closed run's fetch: %v", err)
	}
	if _, ok, err := st.Owed("s"); ok || err != nil {
		t.Fatalf("a closed run still owes (%v)", err)
	}
	if p.done.Load() != 1 {
		t.Fatalf("the source told %d times", p.done.Load())
	}
	if err := st.Release("s"); err != nil {
		t.Fatalf("retention refused the closed run: %v", err)
	}
}

// A stop, and a drain's end, wait only for the holds whose target is
// fetching (WaitHolds): one whose target read none of the run's objects
// for FetchIdle (here: a hold from before the start, its target gone) is
// not waited for; one whose target just read an object is, until the
// wait's end. Seen failing first: WaitHolds waited for every hold, the
// idle one for its whole bound.
func TestWaitHoldsOnlyForFetching(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/wait-fetching/", 5*time.Second)
	a := join(t, dir, "a")
	m, st, _, rec := room(t, a, &peers{})
	target := record.Sum([]byte("target"))
	if err := st.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := st.AddHold("r", target, rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := m.GoOn(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	began := time.Now()
	hs, err := m.WaitHolds(ctx)
	cancel()
	if took := time.Since(began); err != nil || len(hs) != 1 || took > time.Second {
		t.Fatalf("waiting with an idle hold: %v, %v after %v; want the hold, at once", hs, err, took)
	}
	objs, err := bundle.Reached(st, rec, true)
	if err != nil || len(objs) == 0 {
		t.Fatalf("the run's objects: %v, %v", objs, err)
	}
	if err := m.ServesObject(target, objs[0]); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	began = time.Now()
	hs, err = m.WaitHolds(ctx)
	cancel()
	if took := time.Since(began); err != nil || len(hs) != 1 || took < 300*time.Millisecond {
		t.Fatalf("waiting with a hold being fetched: %v, %v after %v; want the hold, at the wait's end", hs, err, took)
	}
}

// A hold's life restarts at each read of its target: a target still
// fetching (a slow link) keeps its source past HoldLife from the hold's
// making, the renewal kept in the store (the hold's Since) for the next
// start; HoldLife after the last read, the hold ends. Seen failing first:
// the hold expired HoldLife after it was made, read or not.
func TestHoldLifeRestartsAtEachRead(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/hold-renew/", 5*time.Second)
	a := join(t, dir, "a")
	m, st, _, rec := room(t, a, &peers{})
	target := record.Sum([]byte("target"))
	if err := st.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := st.AddHold("r", target, rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := m.GoOn(); err != nil {
		t.Fatal(err)
	}
	objs, err := bundle.Reached(st, rec, true)
	if err != nil || len(objs) == 0 {
		t.Fatalf("the run's objects: %v, %v", objs, err)
	}
	time.Sleep(20 * time.Millisecond)
	before := time.Now()
	if err := m.ServesObject(target, objs[0]); err != nil {
		t.Fatal(err)
	}
	m.expireHolds(before.Add(HoldLife))
	h, ok, err := st.HoldOf("r")
	if err != nil || !ok {
		t.Fatalf("a hold read HoldLife ago at most ended: %v", err)
	}
	if h.Since.Before(before) {
		t.Fatalf("the hold's life restarted at %v, not at its last read (after %v)", h.Since, before)
	}
	m.expireHolds(time.Now().Add(HoldLife + time.Minute))
	if _, ok, _ := st.HoldOf("r"); ok {
		t.Fatal("a hold unread for HoldLife stays")
	}
}

// The runs this host owes slabs are listed (Owings; GET /v1/host) with
// their source, head, slabs owed and the state of their fetch: waiting,
// with the last try's error, while the source cannot serve; stopped
// when no fetch runs. Seen failing first: no list but per run.
func TestOwingsListed(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/owings-listed/", 5*time.Second)
	a := join(t, dir, "a")
	m, _, _, _ := room(t, a, &peers{}) // its source: "no source in these tests"
	source := record.Sum([]byte("source"))
	o := &store.Owing{Source: source}
	rec := slabbedOwing(t, m, a, o)
	ows, err := m.Owings()
	if err != nil || len(ows) != 1 {
		t.Fatalf("owings %+v, %v; want the run", ows, err)
	}
	if x := ows[0]; x.Run != "s" || x.Source != source || x.Head != rec.Head() || x.Slabs != 1 || x.State != OwingStopped || x.Reason != "" {
		t.Fatalf("owing %+v, want run s from %s at %s owing 1 slab, stopped", x, source, rec.Head())
	}
	m.payLater("s")
	deadline := time.Now().Add(10 * time.Second)
	for {
		ows, err = m.Owings()
		if err == nil && len(ows) == 1 && ows[0].State == OwingWaiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("owings %+v, %v; want the run waiting", ows, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(ows[0].Reason, "no source in these tests") || ows[0].Tried.IsZero() {
		t.Fatalf("a waiting owing's reason %q at %v, want the last try's error", ows[0].Reason, ows[0].Tried)
	}
	if x, ok, err := m.OwingOf("s"); err != nil || !ok || x.Run != "s" || x.State != OwingWaiting || x.Reason == "" {
		t.Fatalf("the run's owing %+v, %v, %v; want it waiting", x, ok, err)
	}
	if _, ok, err := m.OwingOf("none"); err != nil || ok {
		t.Fatalf("a run owing nothing: %v, %v", ok, err)
	}
}

// heldRun is a member of a fleet under prefix whose run "r", handed off
// at its record rec's head, is held for host target; other is another
// host's key.
func heldRun(t *testing.T, prefix string) (m *Member, st *store.Store, rec *record.Record, target, other record.Address) {
	t.Helper()
	c := etcdtest.Shared(t)
	a := join(t, fleet.New(c.Client(t), prefix, 5*time.Second), "a")
	m, st, _, rec = room(t, a, &peers{})
	target, other = record.Sum([]byte("target")), record.Sum([]byte("other"))
	if err := st.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if err := st.AddHold("r", target, rec.Head()); err != nil {
		t.Fatal(err)
	}
	return m, st, rec, target, other
}
