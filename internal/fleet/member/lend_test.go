package member

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// alone is a member of a fleet of its own under prefix, its session a,
// with fake peers p (room).
func alone(t *testing.T, prefix string) (*Member, *store.Store, *fleet.Session, *peers) {
	t.Helper()
	dir := fleet.New(etcdtest.Shared(t).Client(t), prefix, 5*time.Second)
	a := join(t, dir, "a")
	p := &peers{}
	m, st, _, _ := room(t, a, p)
	return m, st, a, p
}

// owingFrom stores in m's store run "s" owing two slabs, one chunk each,
// which src, the source, holds and m's store does not.
func owingFrom(t *testing.T, m *Member, h *fleet.Session, p *peers) (o *store.Owing, chunks [][]byte) {
	t.Helper()
	chunks = [][]byte{bytes.Repeat([]byte{'a'}, 16<<10), bytes.Repeat([]byte{'b'}, 16<<10)}
	o = &store.Owing{Source: record.Sum([]byte("source"))}
	slabbedOwingOf(t, m, h, o, chunks...)
	src, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	st := m.cfg.Store
	for _, a := range o.Slabs {
		b, err := st.ReadAll(a)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.PutBytes(b); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(st.Path(a)); err != nil { // not here yet
			t.Fatal(err)
		}
	}
	p.from = src
	return o, chunks
}

// A lazy resume borrows a run's owed slabs: each chunk it asks for is
// fetched, verified, into the slab's file, which it reads on after the
// background fetch adopted the slab and the owing ended; the loan's end
// removes the file. Seen failing first: the file went with the adoption.
func TestLendServesWhileTheFetchGoesOn(t *testing.T) {
	m, st, a, p := alone(t, "/lend/")
	o, chunks := owingFrom(t, m, a, p)
	l, err := m.Lend(t.Context(), "s")
	if err != nil || l == nil {
		t.Fatalf("lend: %v, %v", l, err)
	}
	defer l.Close()
	var paths []string
	for i, slab := range o.Slabs {
		path, ok := l.Path(slab)
		if !ok {
			t.Fatalf("slab %d is not lent", i)
		}
		if err := l.Fetch(t.Context(), slab, 0, 16<<10); err != nil {
			t.Fatalf("fetch of slab %d: %v", i, err)
		}
		if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, chunks[i]) {
			t.Fatalf("slab %d's file after the fetch: %v", i, err)
		}
		paths = append(paths, path)
	}
	if err := l.Fetch(t.Context(), o.Slabs[0], 4096, 4096); !errors.Is(err, errNoChunk) {
		t.Fatalf("a fetch of no chunk: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st.Owes("s") != nil || p.done.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the background fetch did not end the owing: %v, told %d", st.Owes("s"), p.done.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, path := range paths {
		if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, chunks[i]) {
			t.Fatalf("slab %d's file, adopted and lent: %v", i, err)
		}
		if !st.Has(o.Slabs[i]) {
			t.Fatalf("slab %d not adopted", i)
		}
	}
	l.Close()
	for _, path := range paths {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the loan ended, %s stays: %v", path, err)
		}
	}
	if n := payersLeft(m); n != 0 {
		t.Fatalf("%d payers left after the loan", n)
	}
}

// payersLeft is how many runs' payers m keeps.
func payersLeft(m *Member) int {
	m.paying.mu.Lock()
	defer m.paying.mu.Unlock()
	return len(m.paying.runs)
}

// A run that owes nothing lends nothing; a stranded owing is refused at
// once, as Pay refuses it.
func TestLendNothingOrRefused(t *testing.T) {
	m, st, a, p := alone(t, "/lend-refused/")
	if l, err := m.Lend(t.Context(), "r"); l != nil || err != nil {
		t.Fatalf("lend of a run owing nothing: %v, %v", l, err)
	}
	owingFrom(t, m, a, p)
	if err := st.Strand("s", "test"); err != nil {
		t.Fatal(err)
	}
	if l, err := m.Lend(t.Context(), "s"); l != nil || !errors.Is(err, store.ErrStranded) {
		t.Fatalf("lend of a stranded owing: %v, %v", l, err)
	}
}

// A source that sends wrong bytes for a lent slab fails the loan's fetch
// (store.ErrOwed, transfer.ErrMismatch), and that loan's slab stays
// refused; but the background fetch's next try asks the source anew, in
// a fresh file: once the source serves the right bytes the owing ends,
// the loan still open. Seen failing first: every try reused the refused
// slab while the loan lasted.
func TestLendRefusedSlabRetired(t *testing.T) {
	m, st, a, p := alone(t, "/lend-retired/")
	o, _ := owingFrom(t, m, a, p)
	path := p.from.Path(o.Slabs[0])
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	bad[5] ^= 1
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := m.Lend(t.Context(), "s")
	if err != nil || l == nil {
		t.Fatalf("lend: %v, %v", l, err)
	}
	defer l.Close()
	if err := l.Fetch(t.Context(), o.Slabs[0], 0, 16<<10); !errors.Is(err, store.ErrOwed) || !errors.Is(err, transfer.ErrMismatch) {
		t.Fatalf("fetch of wrong bytes: %v", err)
	}
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for st.Owes("s") != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the owing did not end once the source served the right bytes: %v", st.Owes("s"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := l.Fetch(t.Context(), o.Slabs[0], 0, 16<<10); !errors.Is(err, transfer.ErrMismatch) {
		t.Fatalf("the loan's refused slab fetched again: %v", err)
	}
}
