package member

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// handedTo leaves run "r" of m's store (rec) handed off there and owned
// by session to in the directory, as after m migrated it to that host.
func handedTo(t *testing.T, from, to *fleet.Session, m *Member, rec *record.Record) {
	t.Helper()
	if _, err := from.Transfer(t.Context(), rec.Genesis(), to.Key()); err != nil {
		t.Fatal(err)
	}
	if err := m.cfg.Store.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if _, err := to.Claim(t.Context(), rec.Genesis(), "r", rec.Head(), record.PhaseParked); err != nil {
		t.Fatal(err)
	}
}

// Only the run's owner is heard; a host that holds the run handed off
// then rehashes what its record reaches, and the fetch that follows is
// told so. (Seen failing first with the owner's check off: a host that
// does not own the run started the rehash.)
func TestExpect(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/expect/", 5*time.Second)
	a, b, other := join(t, dir, "a"), join(t, dir, "b"), join(t, dir, "other")
	m, _, _, rec := room(t, a, &peers{})
	g := rec.Genesis()

	if err := m.Expect(t.Context(), a.Key(), g); err != nil {
		t.Fatalf("the run is here, not handed off: %v", err)
	}
	if m.expect.cur != nil {
		t.Fatal("a rehash began for a run not handed off here")
	}
	handedTo(t, a, b, m, rec)
	if err := m.Expect(t.Context(), other.Key(), g); !errors.Is(err, ErrUnsolicited) {
		t.Fatalf("expected by a host that does not own the run: %v", err)
	}
	if m.expect.cur != nil {
		t.Fatal("a rehash began for a host that does not own the run")
	}
	if err := m.Expect(t.Context(), b.Key(), record.Sum([]byte("no such run"))); !errors.Is(err, ErrUnsolicited) {
		t.Fatalf("a run the directory lacks: %v", err)
	}
	if err := m.Expect(t.Context(), b.Key(), g); err != nil {
		t.Fatal(err)
	}
	first := m.expect.cur
	<-first.done
	if err := m.Expect(t.Context(), b.Key(), g); err != nil || m.expect.cur != first {
		t.Fatalf("the run expected again before a fetch took its rehash: %v, a new rehash %v", err, m.expect.cur != first)
	}
	rehashed := m.expect.rehashed(t.Context(), g)
	if rehashed == nil {
		t.Fatal("the owner's expectation rehashed nothing")
	}
	if err := m.Expect(t.Context(), b.Key(), g); err != nil || m.expect.cur == first {
		t.Fatalf("the run expected again after a fetch took its rehash: %v, a new rehash %v", err, m.expect.cur != first)
	}
	for _, a := range []record.Address{rec.Unit(), rec.Grants(), *rec.Segment(rec.Len() - 1).Snapshot.Transcript} {
		if !rehashed(a) {
			t.Fatalf("object %s of the run was not rehashed", a)
		}
	}
	if m.expect.rehashed(t.Context(), record.Sum([]byte("another run"))) != nil {
		t.Fatal("another run's fetch was told of this run's rehash")
	}
}

// A host whose last expectation no fetch took starts no other rehash
// within ExpectFor: expectations alone cannot keep this host hashing.
func TestExpectUntakenWaits(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/expect-untaken/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	m, _, _, rec := room(t, a, &peers{})
	handedTo(t, a, b, m, rec)
	if err := m.Expect(t.Context(), b.Key(), rec.Genesis()); err != nil {
		t.Fatal(err)
	}
	first := m.expect.cur
	<-first.done
	first.ended = time.Now() // as if another run: only the host's word counts
	first.genesis = record.Sum([]byte("another run of b's"))
	if err := m.Expect(t.Context(), b.Key(), rec.Genesis()); err != nil {
		t.Fatal(err)
	}
	if m.expect.cur != first {
		t.Fatal("a host whose expectation no fetch took started another rehash")
	}
	first.used = true
	if err := m.Expect(t.Context(), b.Key(), rec.Genesis()); err != nil {
		t.Fatal(err)
	}
	if m.expect.cur == first {
		t.Fatal("a host whose expectation a fetch took started no rehash")
	}
}

// A damaged copy held here is not counted rehashed: the fetch's import
// reads it, and refuses it.
func TestExpectDamaged(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/expect-damaged/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	m, st, _, rec := room(t, a, &peers{})
	handedTo(t, a, b, m, rec)
	tr := *rec.Segment(rec.Len() - 1).Snapshot.Transcript
	p := st.Path(tr)
	orig, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append([]byte("x"), orig[1:]...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.Expect(t.Context(), b.Key(), rec.Genesis()); err != nil {
		t.Fatal(err)
	}
	rehashed := m.expect.rehashed(t.Context(), rec.Genesis())
	if rehashed == nil || rehashed(tr) || !rehashed(rec.Unit()) {
		t.Fatal("the damaged transcript counted as rehashed, or nothing was")
	}
}

// A migration of an executing run tells the target it is coming before
// the unit is parked.
func TestMigrateTellsTargetExpected(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/expect-told/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	p := &peers{expected: make(chan record.Address, 1)}
	m, _, _, rec := room(t, a, p)
	run := &parked{executing: true}
	hold := func() (Held, func(), error) { return run, func() {}, nil }
	if err := m.migrate(t.Context(), "r", b.Key(), hold, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-p.expected:
		if g != rec.Genesis() {
			t.Fatalf("told of %s, the run is %s", g, rec.Genesis())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the target was not told the run is coming")
	}
}
