package member

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A source answering that it holds the run for this host no more
// (Peers.Held false) strands the owing before anything is fetched: the
// try is refused store.ErrStranded, the owing kept as it was, listed
// stranded with the reason; no try asks again, the background fetch ends
// at its first try, a resume's Pay is refused
// at once (ErrStranded with ErrOwed, the source not asked); the run's
// close ends the owing, its source told.
func TestNotHeldStrandsOwing(t *testing.T) {
	p := &peers{notHeld: true}
	m, st, _, rec := lackingSlab(t, "/not-held/", p)
	if err := m.payOnce(t.Context(), "s"); !errors.Is(err, store.ErrStranded) {
		t.Fatalf("a try of a run its source holds no more: %v, want ErrStranded", err)
	}
	if p.asked.Load() != 1 || p.done.Load() != 0 {
		t.Fatalf("held asked %d times, done %d; want 1, 0", p.asked.Load(), p.done.Load())
	}
	if got, ok, err := st.Owed("s"); err != nil || !ok || len(got.Slabs) != 1 || got.Head != rec.Head() {
		t.Fatalf("the stranded owing: %+v, %v, %v; want it as it was", got, ok, err)
	}
	x, ok, err := m.OwingOf("s")
	if err != nil || !ok || x.State != OwingStranded || !strings.Contains(x.Reason, "held: false") || x.Tried.IsZero() {
		t.Fatalf("the run's owing %+v, %v, %v; want it stranded, with its reason", x, ok, err)
	}
	if err := m.payOnce(t.Context(), "s"); !errors.Is(err, store.ErrStranded) || p.asked.Load() != 1 {
		t.Fatalf("a second try: %v, held asked %d times; want ErrStranded, not asked again", err, p.asked.Load())
	}
	// The background fetch (as a start begins it) ends at its first try.
	if !m.payLater("s") {
		t.Fatal("no background fetch")
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m.paying.mu.Lock()
		q := m.paying.runs["s"]
		m.paying.mu.Unlock()
		if q == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the background fetch of a stranded owing goes on")
		}
	}
	err = m.Pay(t.Context(), "s")
	if !errors.Is(err, store.ErrStranded) || !errors.Is(err, store.ErrOwed) || p.asked.Load() != 1 {
		t.Fatalf("pay of a stranded run: %v, held asked %d times; want ErrStranded at once", err, p.asked.Load())
	}
	if _, err := st.Append("s", rec.Head(), record.Closure("closed by request")); err != nil {
		t.Fatal(err)
	}
	m.Closed("s")
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok, err := st.Owed("s"); err == nil && !ok {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the closed stranded run still owes")
		}
	}
	if _, ok, _ := st.StrandOf("s"); ok || p.done.Load() != 1 {
		t.Fatalf("stranded after its close: %v; its source told %d times, want once", ok, p.done.Load())
	}
}

// A source whose answer to Held is not an answer (an older source has no
// such route; the link fails) leaves the owing to the fetch: the try goes
// on to fetch, and its failure is the fetch's, the owing not stranded.
func TestHeldUnknownKeepsFetching(t *testing.T) {
	p := &peers{notHeld: true, heldErr: errors.New("host: status 404")}
	m, st, _, _ := lackingSlab(t, "/held-unknown/", p)
	err := m.payOnce(t.Context(), "s")
	if err == nil || errors.Is(err, store.ErrStranded) || !strings.Contains(err.Error(), "no source in these tests") {
		t.Fatalf("a try whose source did not answer held: %v; want the fetch's error", err)
	}
	if _, ok, _ := st.StrandOf("s"); ok || p.asked.Load() != 1 {
		t.Fatalf("stranded %v, held asked %d times; want not stranded, asked once", ok, p.asked.Load())
	}
}

// A source that stalls on Held is given up on at askHeldTimeout, its
// answer unknown: the try goes on to fetch, and the owing is not
// stranded.
func TestHeldStalledIsUnknown(t *testing.T) {
	p := &peers{stall: true}
	m, st, _, _ := lackingSlab(t, "/held-stalled/", p)
	defer func(d time.Duration) { askHeldTimeout = d }(askHeldTimeout)
	askHeldTimeout = 100 * time.Millisecond
	began := time.Now()
	err := m.payOnce(t.Context(), "s")
	if took := time.Since(began); took > 5*time.Second || err == nil || errors.Is(err, store.ErrStranded) || !strings.Contains(err.Error(), "no source in these tests") {
		t.Fatalf("a try whose source stalls on held: %v after %v; want the fetch's error, at once", err, took)
	}
	if _, ok, _ := st.StrandOf("s"); ok {
		t.Fatal("stranded on a stalled answer")
	}
}

// A source whose slab never hashes to its address (a damaged or hostile
// source) strands the owing after StrandAfter tries in a row refused for
// it (transfer.ErrMismatch), not before; a try that fails otherwise (the
// source unreachable) neither counts nor restarts the count.
func TestDamagedSourceStrands(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/damaged-source/", 5*time.Second)
	a := join(t, dir, "a")
	p := &peers{}
	m, st, _, _ := room(t, a, p)
	o := &store.Owing{Source: record.Sum([]byte("source"))}
	slabbedOwing(t, m, a, o)
	slab := o.Slabs[0]
	src, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	// The source's copy of the slab: its size, not its bytes.
	if err := os.MkdirAll(filepath.Dir(src.Path(slab)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src.Path(slab), bytes.Repeat([]byte{'b'}, 16<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(st.Path(slab)); err != nil { // not here yet
		t.Fatal(err)
	}
	// The run's payer lives through the tries, as the background fetch
	// that makes them holds it.
	_, release := m.paying.acquire("s")
	defer release()
	for i := 1; i <= StrandAfter; i++ {
		if i == 3 {
			p.from = nil // unreachable: counts not
			if err := m.payOnce(t.Context(), "s"); err == nil || errors.Is(err, transfer.ErrMismatch) || errors.Is(err, store.ErrStranded) {
				t.Fatalf("a try with the source unreachable: %v", err)
			}
		}
		p.from = src
		err := m.payOnce(t.Context(), "s")
		if i < StrandAfter && (!errors.Is(err, transfer.ErrMismatch) || errors.Is(err, store.ErrStranded)) {
			t.Fatalf("try %d: %v, want ErrMismatch, not stranded", i, err)
		}
		if i == StrandAfter && !errors.Is(err, store.ErrStranded) {
			t.Fatalf("try %d: %v, want ErrStranded", i, err)
		}
	}
	sd, ok, err := st.StrandOf("s")
	if err != nil || !ok || !strings.Contains(sd.Reason, "5 tries in a row") {
		t.Fatalf("strand %+v, %v, %v; want its reason", sd, ok, err)
	}
	if st.Has(slab) {
		t.Fatal("the source's wrong bytes were adopted")
	}
}

// A source answers Held (POST /v1/migrations/held) true only to the
// hold's target, naming the head and genesis it was handed over at, as
// Done compares; another host, another head or genesis, a run not held,
// and the target once its hold ended, are answered false.
func TestHeldAnswersOnlyItsTarget(t *testing.T) {
	m, _, rec, target, other := heldRun(t, "/held-answer/")
	at := Handed{Run: "r", Genesis: rec.Genesis(), Head: rec.Head()}
	if held, err := m.Held(target, at); err != nil || !held {
		t.Fatalf("its target asking: %v, %v; want held", held, err)
	}
	for _, bad := range []struct {
		name string
		key  record.Address
		h    Handed
	}{
		{"another host", other, at},
		{"another head", target, Handed{Run: "r", Genesis: rec.Genesis(), Head: record.Sum([]byte("head"))}},
		{"another genesis", target, Handed{Run: "r", Genesis: record.Sum([]byte("genesis")), Head: rec.Head()}},
		{"a run not held", target, Handed{Run: "none", Genesis: rec.Genesis(), Head: rec.Head()}},
	} {
		if held, err := m.Held(bad.key, bad.h); err != nil || held {
			t.Fatalf("%s: %v, %v; want not held", bad.name, held, err)
		}
	}
	if err := m.Done(target, at); err != nil {
		t.Fatal(err)
	}
	if held, err := m.Held(target, at); err != nil || held {
		t.Fatalf("its target after its done: %v, %v; want not held", held, err)
	}
}

// A run closed while its fetch's try is under way, a try that then
// strands the owing (the source's answer comes after the close), still
// has its owing ended by the close (Closed's wake is not lost): the
// stranded fetch waits for it.
func TestClosedDuringStrandingTry(t *testing.T) {
	p := &peers{notHeld: true, heldGate: make(chan struct{})}
	m, st, _, rec := lackingSlab(t, "/closed-stranding/", p)
	if !m.payLater("s") {
		t.Fatal("no background fetch")
	}
	for end := time.Now().Add(10 * time.Second); p.asked.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the source is not asked")
		}
	}
	if _, err := st.Append("s", rec.Head(), record.Closure("closed by request")); err != nil {
		t.Fatal(err)
	}
	m.Closed("s")
	close(p.heldGate) // the answer, held: false, comes after the close
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok, err := st.Owed("s"); err == nil && !ok {
			break
		}
		if time.Now().After(end) {
			_, stranded, _ := st.StrandOf("s")
			t.Fatalf("the run closed during a stranding try still owes (stranded %v)", stranded)
		}
	}
	if p.done.Load() != 1 {
		t.Fatalf("its source told %d times, want once", p.done.Load())
	}
}

// Only a try refused for a mismatch strands the owing: one failing
// otherwise (here the source unreachable) does not, whatever mismatches
// the tries before it counted (StrandAfter of them, a strand the store
// failed to write).
func TestMismatchCountStrandsOnlyAMismatch(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/mismatch-only/", 5*time.Second)
	a := join(t, dir, "a")
	p := &peers{}
	m, st, _, _ := room(t, a, p)
	o := &store.Owing{Source: record.Sum([]byte("source"))}
	slabbedOwing(t, m, a, o)
	q, release := m.paying.acquire("s")
	defer release()
	m.paying.mu.Lock()
	q.mismatches = StrandAfter
	m.paying.mu.Unlock()
	err := m.payOnce(t.Context(), "s")
	if err == nil || errors.Is(err, store.ErrStranded) || !strings.Contains(err.Error(), "no source in these tests") {
		t.Fatalf("a try with the source unreachable: %v; want its error, not stranded", err)
	}
	if _, ok, _ := st.StrandOf("s"); ok {
		t.Fatal("stranded by a try that brought no wrong bytes")
	}
}

// A stranded run's migration onward is refused ErrStranded (not_held),
// its message not promising a move the owing will never allow.
func TestMigrateRefusesStrandedRun(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/migrate-stranded/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	p := &peers{postCopy: true}
	m, st, _, _ := room(t, a, p)
	slabbedOwing(t, m, a, &store.Owing{Source: record.Sum([]byte("source"))})
	if err := st.Strand("s", "the source holds it no more"); err != nil {
		t.Fatal(err)
	}
	err := m.migrate(t.Context(), "s", b.Key(), func() (Held, func(), error) { return &parked{}, func() {}, nil }, nil)
	if !errors.Is(err, store.ErrStranded) || strings.Contains(err.Error(), "moves once") {
		t.Fatalf("migrating a stranded run: %v; want ErrStranded, no move promised", err)
	}
}

// A try that adopts a slab restarts the mismatch count: a source whose
// other slab still comes wrong has made progress, and its owing is not
// stranded though the tries before counted StrandAfter-1 mismatches.
func TestAdoptedSlabRestartsMismatchCount(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/adopted-restarts/", 5*time.Second)
	a := join(t, dir, "a")
	p := &peers{}
	m, st, _, _ := room(t, a, p)
	good, bad := bytes.Repeat([]byte{'a'}, 16<<10), bytes.Repeat([]byte{'c'}, 16<<10)
	o := &store.Owing{Source: record.Sum([]byte("source"))}
	slabbedOwingOf(t, m, a, o, good, bad)
	src, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	p.from = src
	// The source's copies: the first slab right, the second wrong.
	for i, b := range [][]byte{good, bytes.Repeat([]byte{'b'}, 16<<10)} {
		s := o.Slabs[i]
		if err := os.MkdirAll(filepath.Dir(src.Path(s)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(src.Path(s), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(st.Path(s)); err != nil { // not here yet
			t.Fatal(err)
		}
	}
	q, release := m.paying.acquire("s")
	defer release()
	m.paying.mu.Lock()
	q.mismatches = StrandAfter - 1
	m.paying.mu.Unlock()
	err = m.payOnce(t.Context(), "s")
	if !errors.Is(err, transfer.ErrMismatch) || errors.Is(err, store.ErrStranded) {
		t.Fatalf("a try adopting one slab, the other wrong: %v; want ErrMismatch, not stranded", err)
	}
	if !st.Has(o.Slabs[0]) || st.Has(o.Slabs[1]) {
		t.Fatalf("adopted: first %v, second %v; want the first only", st.Has(o.Slabs[0]), st.Has(o.Slabs[1]))
	}
	if _, ok, _ := st.StrandOf("s"); ok {
		t.Fatal("stranded though the try adopted a slab")
	}
}

// lackingSlab is a member of a fleet under prefix, its peers p, that owes
// run "s" (o, from the source "source", its record rec) and lacks the
// first owed slab.
func lackingSlab(t *testing.T, prefix string, p *peers) (m *Member, st *store.Store, o *store.Owing, rec *record.Record) {
	t.Helper()
	c := etcdtest.Shared(t)
	a := join(t, fleet.New(c.Client(t), prefix, 5*time.Second), "a")
	m, st, _, _ = room(t, a, p)
	o = &store.Owing{Source: record.Sum([]byte("source"))}
	rec = slabbedOwing(t, m, a, o)
	if err := os.Remove(st.Path(o.Slabs[0])); err != nil { // not here yet
		t.Fatal(err)
	}
	return m, st, o, rec
}
