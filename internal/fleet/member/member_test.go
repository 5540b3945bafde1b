package member

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// counts is the room's Metrics, counted.
type counts struct{ out, in, failed, refused, drained atomic.Int32 }

func (c *counts) Migrated(out, ok bool, _ time.Duration) {
	if out && ok {
		c.out.Add(1)
	} else if ok {
		c.in.Add(1)
	} else {
		c.failed.Add(1)
	}
}
func (c *counts) Drained(bool)      { c.drained.Add(1) }
func (c *counts) OwnershipRefused() { c.refused.Add(1) }

// peers are other hosts that answer as told. A fetch brings run src of
// store from (the peer's): its record, and its objects staged as
// internal/fleet/transfer stages them, from the peer's transfer.Handler.
type peers struct {
	silent  bool // its Offer never answers
	hand    error
	onHand  func() // what the target does before it answers a hand
	handed  atomic.Int32
	fetched atomic.Int32
	from    *store.Store
	src     string
	last    Handed // the last hand-over asked
	owing   bool   // its answer to a hand: it owes slabs
	done    atomic.Int32
	owe     []bool // each fetch's FetchOptions.Owe, in order
	// postCopy is its offer's word: it takes parked runs post-copy.
	postCopy bool
	offered  atomic.Int32 // offers asked
	// gate, when not nil, is called before each object the source serves.
	gate func(*http.Request)
	free func() (uint64, error) // the last fetch's FetchOptions.Free
	// notHeld is its Held answer: false (else true); heldErr, when set,
	// its Held error instead. asked counts the Held asked.
	notHeld bool
	heldErr error
	asked   atomic.Int32
	stall   bool // its Held answers nothing until its context ends
	// heldGate, when not nil, is waited on by Held before it answers.
	heldGate chan struct{}
	// expected are the geneses its Expect was told of.
	expected chan record.Address
	// rehashed is the last fetch's FetchOptions.Rehashed.
	rehashed func(record.Address) (time.Time, bool)
}

func (p *peers) Expect(_ context.Context, _, genesis record.Address) error {
	if p.expected != nil {
		p.expected <- genesis
	}
	return nil
}

func (p *peers) Hand(_ context.Context, _ record.Address, h Handed) (bool, error) {
	p.handed.Add(1)
	p.last = h
	if p.onHand != nil {
		p.onHand()
	}
	return p.owing, p.hand
}

func (p *peers) Source(context.Context, record.Address) (transfer.Source, func(), error) {
	if p.from == nil {
		return transfer.Source{}, nil, errors.New("no source in these tests")
	}
	h := transfer.Handler(p.from)
	if p.gate != nil {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p.gate(r)
			inner.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(h)
	return transfer.Source{Client: srv.Client(), Base: srv.URL}, srv.Close, nil
}

func (p *peers) Done(context.Context, record.Address, Handed) error {
	p.done.Add(1)
	return nil
}

func (p *peers) Held(ctx context.Context, _ record.Address, _ Handed) (bool, error) {
	p.asked.Add(1)
	if p.heldGate != nil {
		select {
		case <-p.heldGate:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	if p.stall {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return !p.notHeld, p.heldErr
}

func (p *peers) Fetch(ctx context.Context, _ record.Address, _ string, judge func(*record.Record) error, opt FetchOptions) (*record.Record, Arrival, error) {
	p.fetched.Add(1)
	p.owe = append(p.owe, opt.Owe)
	p.rehashed = opt.Rehashed
	p.free = opt.Free
	if p.from == nil {
		return nil, nil, errors.New("no fetch in these tests")
	}
	rec, err := p.from.Record(p.src)
	if err != nil {
		return nil, nil, err
	}
	if err := judge(rec); err != nil {
		return nil, nil, err
	}
	srv := httptest.NewServer(transfer.Handler(p.from))
	defer srv.Close()
	f, _, err := transfer.Stage(ctx, transfer.Source{Client: srv.Client(), Base: srv.URL}, opt.Store, rec, transfer.Options{Limits: opt.Limits})
	if err != nil {
		return nil, nil, err
	}
	return rec, f, nil
}

func (p *peers) Offer(ctx context.Context, _ record.Address, _ []string) (drain.Offer, error) {
	p.offered.Add(1)
	if p.silent {
		<-ctx.Done()
		return drain.Offer{}, ctx.Err()
	}
	return drain.Offer{Free: 1 << 40, ImageParks: true, PostCopy: p.postCopy}, nil
}

// parked is a run held parked, never executing unless told; its park and
// resume fail when told to.
type parked struct {
	parks, resumes atomic.Int32
	manifest       manifest.Manifest // its need's
	executing      bool
	park, resume   error
	onResume       func() // what happens while it resumes
}

func (p *parked) Executing() bool            { return p.executing }
func (p *parked) Park(context.Context) error { p.parks.Add(1); return p.park }
func (p *parked) Resume(context.Context) error {
	p.resumes.Add(1)
	if p.onResume != nil {
		p.onResume()
	}
	return p.resume
}
func (p *parked) Drop() {}
func (p *parked) Freeze(context.Context) (func(context.Context), error) {
	return nil, nil
}
func (p *parked) Need(context.Context) (drain.Need, error) {
	return drain.Need{Run: "r", Image: "example/unit:1", Manifest: p.manifest}, nil
}

var key = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))

// room is a member over a store holding run "r" parked (forged, imported),
// in a fleet under session h, which has claimed the run.
func room(t *testing.T, h *fleet.Session, p Peers) (*Member, *store.Store, *counts, *record.Record) {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	b, err := bundletest.Run{Spec: unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: unit.TranscriptMode, Args: []string{"a"}},
		Grants: unit.Grants{Network: unit.NoNetwork}, Key: key, Transcript: []byte("{\"t\":1}\n")}.Forge("r")
	if err != nil {
		t.Fatal(err)
	}
	trusted := func(record.Address) bool { return true }
	if _, err := bundle.Import(t.Context(), st, bytes.NewReader(b.Tar(nil)), bundle.ImportOptions{Options: bundle.Options{Trusted: trusted}}); err != nil {
		t.Fatal(err)
	}
	c := &counts{}
	m := New(Config{Join: Join{Fleet: h, Peers: p}, Store: st, Metrics: c, Publish: func(events.Event) {},
		Import:     bundle.ImportOptions{Options: bundle.Options{Trusted: trusted}, CheckID: func(string) error { return nil }},
		Exportable: func(id string) error { return bundle.Exportable(st, id) }})
	t.Cleanup(m.paying.close)
	if _, err := h.Claim(t.Context(), b.Record.Genesis(), "r", b.Record.Head(), record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	return m, st, c, b.Record
}

// handedOff records the runs m tells handed off here (Config.HandedOff).
func handedOff(m *Member) *[]string {
	var ids []string
	m.cfg.HandedOff = func(id string) { ids = append(ids, id) }
	return &ids
}

func join(t *testing.T, dir *fleet.Dir, name string) *fleet.Session {
	t.Helper()
	k := record.Sum([]byte("host " + name))
	if err := dir.Admit(t.Context(), k, name, fleet.RoleHost); err != nil {
		t.Fatal(err)
	}
	h, err := dir.Join(t.Context(), k, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// A migration the target refuses takes everything back: the run is this
// host's in the directory (no transfer pending) and not handed off in the
// store, so it resumes here. One the target takes leaves the run
// transferred in the directory and handed off in the store.
func TestMigrate(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/member/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	refusing := &peers{hand: errors.New("the target refused")}
	m, st, n, rec := room(t, a, refusing)
	left := handedOff(m)
	run := &parked{}
	hold := func() (Held, func(), error) { return run, func() {}, nil }

	err := m.migrate(t.Context(), "r", b.Key(), hold, nil)
	if !errors.Is(err, refusing.hand) || refusing.handed.Load() != 1 {
		t.Fatalf("migrate to a refusing target: %v", err)
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != a.Key() || !e.To.IsZero() {
		t.Fatalf("after the refusal the directory says %+v, %v", e, err)
	}
	if _, off, _ := st.HandedOff("r"); off || n.out.Load() != 0 || len(*left) != 0 {
		t.Fatalf("after the refusal the run is handed off, or a migration counted, or the run told handed off (%q)", *left)
	}

	// While the target takes the run, it — and no other host — may read
	// the run's record and the objects it reaches; once the hand-over
	// returns, no host may.
	taking := &peers{}
	m.cfg.Peers = taking
	stranger := record.Sum([]byte("another host"))
	reads := func(key record.Address) []error {
		return []error{m.ServesRecord(key, "r"), m.ServesObject(key, rec.Unit()), m.Serves(key)}
	}
	taking.onHand = func() {
		for i, err := range reads(b.Key()) {
			if err != nil {
				t.Errorf("read %d by the target during the hand-over: %v", i, err)
			}
		}
		if err := m.ServesObject(b.Key(), record.Sum([]byte("not the run's"))); !errors.Is(err, ErrUnsolicited) {
			t.Errorf("an object the run does not reach, to the target: %v", err)
		}
		if err := m.ServesRecord(b.Key(), "another"); !errors.Is(err, ErrUnsolicited) {
			t.Errorf("another run's record, to the target: %v", err)
		}
		for i, err := range reads(stranger) {
			if !errors.Is(err, ErrUnsolicited) {
				t.Errorf("read %d by another host during the hand-over: %v", i, err)
			}
		}
	}
	if err := m.migrate(t.Context(), "r", b.Key(), hold, nil); err != nil {
		t.Fatal(err)
	}
	if h := taking.last; h.Run != "r" || h.Genesis != rec.Genesis() || h.Head != rec.Head() || h.Resume {
		t.Fatalf("the hand-over named %+v", h)
	}
	for i, err := range reads(b.Key()) {
		if !errors.Is(err, ErrUnsolicited) {
			t.Errorf("read %d by the target after the hand-over: %v", i, err)
		}
	}
	if e, _ := dir.Run(t.Context(), rec.Genesis()); e.To != b.Key() {
		t.Fatalf("after the migration the directory says %+v", e)
	}
	if _, off, _ := st.HandedOff("r"); !off || n.out.Load() != 1 || run.parks.Load() != 0 {
		t.Fatalf("after the migration: handed off %v, %d counted, %d parks of a parked run", off, n.out.Load(), run.parks.Load())
	}
	if !slices.Equal(*left, []string{"r"}) {
		t.Fatalf("after the migration the runs told handed off: %q, want r", *left)
	}
}

// A host being drained takes no run: refused before anything is fetched.
// A host alone migrates, receives and adopts nothing.
func TestRefusals(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/refuse/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	p := &peers{}
	m, _, _, _ := room(t, a, p)
	m.draining.Store(true)
	never := func() (Held, func(), error) { t.Fatal("held"); return nil, nil, nil }
	if err := m.receive(t.Context(), b.Key(), Handed{Run: "r2"}, never); !errors.Is(err, ErrDraining) || p.fetched.Load() != 0 {
		t.Fatalf("receive while draining: %v (%d fetches)", err, p.fetched.Load())
	}
	alone := New(Config{Store: m.cfg.Store})
	for name, err := range map[string]error{
		"migrate": alone.migrate(t.Context(), "r", b.Key(), never, nil),
		"receive": alone.receive(t.Context(), b.Key(), Handed{Run: "r", Resume: true}, never),
		"adopt":   alone.adopt(t.Context(), "r", never),
	} {
		if !errors.Is(err, ErrNoFleet) {
			t.Errorf("%s alone: %v", name, err)
		}
	}
	if alone.Records() != any(m.cfg.Store) {
		t.Error("alone, appends do not go to the store directly")
	}
}

// An adopt while the owner lives is refused (and counted), the store as it
// was; once its session is gone the run is adopted at the record's head.
func TestAdopt(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/adopt/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	_, st, _, rec := room(t, a, &peers{})
	n := &counts{}
	mb := New(Config{Join: Join{Fleet: b}, Store: st, Metrics: n, Publish: func(events.Event) {},
		Import: bundle.ImportOptions{Options: bundle.Options{Trusted: func(record.Address) bool { return true }}}})
	hold := func() (Held, func(), error) { return &parked{}, func() {}, nil }
	if err := mb.adopt(t.Context(), "r", hold); !errors.Is(err, fleet.ErrNotOwner) || n.refused.Load() != 1 {
		t.Fatalf("adopt while the owner lives: %v (%d refusals counted)", err, n.refused.Load())
	}
	if err := a.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := mb.adopt(t.Context(), "r", hold); err != nil {
		t.Fatal(err)
	}
	if e, _ := dir.Run(t.Context(), rec.Genesis()); e.Owner != b.Key() || e.Head != rec.Head() {
		t.Fatalf("after the adopt the directory says %+v", e)
	}
}

// A host that never answers its offer holds a drain up for OfferTimeout at
// most, and is offered nothing; a host named twice is asked once.
func TestDrainSilentHost(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/silent/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	m, _, _, _ := room(t, a, &peers{silent: true})
	defer func(d time.Duration) { OfferTimeout = d }(OfferTimeout)
	OfferTimeout = 200 * time.Millisecond
	moved := 0
	out, err := m.drainRuns(t.Context(), []record.Address{b.Key(), b.Key()}, []drain.Run{{ID: "r"}}, []drain.Need{{Run: "r"}},
		drain.Options{Parallel: 2, Migrate: func(context.Context, string, record.Address) error { moved++; return nil }})
	if err != nil || len(out) != 1 || !errors.Is(out[0].Err, context.DeadlineExceeded) || moved != 0 {
		t.Fatalf("%+v, %v, %d moved", out, err, moved)
	}
	if e, err := dir.Member(t.Context(), a.Key()); err != nil || !e.Draining {
		t.Fatalf("the drained host is not marked draining: %+v, %v", e, err)
	}
}

// A migration to a host whose offer the run does not fit is refused before
// anything changes: the executing unit is not parked, nothing is
// transferred or handed off, and the target is never asked to take it.
func TestMigrateRefusedBeforeItMoves(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/unfit/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	p := &peers{}
	m, st, _, rec := room(t, a, p)
	run := &parked{executing: true, manifest: manifest.Manifest{manifest.Arch: "riscv64"}}
	err := m.migrate(t.Context(), "r", b.Key(), func() (Held, func(), error) { return run, func() {}, nil }, nil)
	if !errors.Is(err, drain.ErrManifest) || run.parks.Load() != 0 || p.handed.Load() != 0 {
		t.Fatalf("migrate to an unfit host: %v (%d parks, %d hands)", err, run.parks.Load(), p.handed.Load())
	}
	if e, _ := dir.Run(t.Context(), rec.Genesis()); e.Owner != a.Key() || !e.To.IsZero() {
		t.Fatalf("the directory says %+v", e)
	}
	if _, off, _ := st.HandedOff("r"); off {
		t.Fatal("handed off")
	}
}
