package park

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// fakeOwed is one owed slab: its bytes (from a source) go into path, at
// each Fetch, damaged (the first byte flipped) where damage says.
type fakeOwed struct {
	slab   record.Address
	bytes  []byte
	path   string
	damage func(off uint64) bool

	mu      sync.Mutex
	fetched []uint64 // offsets
}

func (f *fakeOwed) Path(slab record.Address) (string, bool) { return f.path, slab == f.slab }

func (f *fakeOwed) Bytes() uint64 { return uint64(len(f.bytes)) }

func (f *fakeOwed) Fetch(_ context.Context, slab record.Address, off, size uint64) error {
	if slab != f.slab {
		return errors.New("not owed")
	}
	b := bytes.Clone(f.bytes[off : off+size])
	if f.damage != nil && f.damage(off) {
		b[0] ^= 1
	}
	w, err := os.OpenFile(f.path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer w.Close()
	if _, err := w.WriteAt(b, int64(off)); err != nil {
		return err
	}
	f.mu.Lock()
	f.fetched = append(f.fetched, off)
	f.mu.Unlock()
	return nil
}

// owedPark is servedPark whose slab is owed: gone from the store, its
// bytes in a fakeOwed whose file holds none of them yet.
func owedPark(t *testing.T, pages []byte) (*store.Store, Result, *fakeOwed) {
	t.Helper()
	st, res := servedPark(t, pages)
	es, err := st.Listing(*res.Snapshot.Memory)
	if err != nil {
		t.Fatal(err)
	}
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil || len(cfs) != 1 {
		t.Fatalf("chunked files %v, %v", cfs, err)
	}
	slab := cfs[0].Chunks[0].In
	b, err := st.ReadAll(slab.Address)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(st.Path(slab.Address)); err != nil {
		t.Fatal(err)
	}
	f := &fakeOwed{slab: slab.Address, bytes: b, path: filepath.Join(t.TempDir(), "owed")}
	if err := os.WriteFile(f.path, make([]byte, len(b)), 0o600); err != nil {
		t.Fatal(err)
	}
	return st, res, f
}

// A served lazy resume of a park whose slab is owed: the eager chunk is
// fetched before the snapshot is offered, and laid out from the owed
// file; every lazy chunk is served from that file, owed (the page server
// has it fetched first), and only once fetched are its pages served.
func TestLayoutServedOwed(t *testing.T) {
	pages := content(61, 600*pageSize)
	st, res, owed := owedPark(t, pages)
	if off, err := OfferedServedOwed(t.Context(), st, res.Snapshot, owed); err != nil || !off.Equal(res.Snapshot) {
		t.Fatalf("offered %s, %v", off, err)
	}
	if len(owed.fetched) != 1 {
		t.Fatalf("fetched %v before the restore, want the eager chunk only", owed.fetched)
	}
	trees, m, err := LayoutServedOwed(st, res.Snapshot, filepath.Join(t.TempDir(), "r"), owed)
	if err != nil {
		t.Fatal(err)
	}
	laid, err := os.ReadFile(filepath.Join(trees.ImageDir, "pages-1.img"))
	if err != nil || !bytes.Equal(laid[:pageSize], pages[:pageSize]) {
		t.Fatalf("the laid-out eager page is not the owed slab's (%v)", err)
	}
	if m.Fetch == nil {
		t.Fatal("a table with owed extents and no Fetch")
	}
	for i, e := range m.Tasks[0].Extents {
		if e.Owed != (i > 0) || e.Path != owed.path {
			t.Fatalf("extent %d at %#x: owed %v, in %s", i, e.Vaddr, e.Owed, e.Path)
		}
	}
	if _, err := get(t, m, 0x7f0000000000, 1); !errors.Is(err, pageserver.ErrRefused) {
		t.Fatalf("served a chunk not fetched yet: %v", err)
	}
	for _, e := range m.Tasks[0].Extents[1:] {
		if err := m.Fetch(t.Context(), e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := get(t, m, 0x7f0000000000, 556)
	if err != nil || !bytes.Equal(got, pages[pageSize:557*pageSize]) {
		t.Fatalf("served %d bytes (%v), not the run's", len(got), err)
	}
}

// A damaged chunk of an owed slab is refused where it is read: an eager
// one makes the snapshot offered another (the resume refused before the
// restore); a lazy one is not served.
func TestOwedDamageRefused(t *testing.T) {
	pages := content(61, 600*pageSize)
	st, res, owed := owedPark(t, pages)
	owed.damage = func(off uint64) bool { return off == 0 }
	if off, err := OfferedServedOwed(t.Context(), st, res.Snapshot, owed); err != nil || off.Equal(res.Snapshot) {
		t.Fatalf("a damaged eager chunk: offered %s, %v", off, err)
	}
	st, res, owed = owedPark(t, pages)
	if off, err := OfferedServedOwed(t.Context(), st, res.Snapshot, owed); err != nil || !off.Equal(res.Snapshot) {
		t.Fatalf("offered %s, %v", off, err)
	}
	_, m, err := LayoutServedOwed(st, res.Snapshot, filepath.Join(t.TempDir(), "r"), owed)
	if err != nil {
		t.Fatal(err)
	}
	owed.damage = func(uint64) bool { return true }
	if err := m.Fetch(t.Context(), m.Tasks[0].Extents[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, m, m.Tasks[0].Extents[1].Vaddr, 1); !errors.Is(err, pageserver.ErrRefused) {
		t.Fatalf("served a damaged owed chunk: %v", err)
	}
}
