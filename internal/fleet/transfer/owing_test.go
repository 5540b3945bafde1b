package transfer_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// slabbedRun stores in st an image run whose memory image holds a pages
// file in the slab form: two slabs, three 16 KiB chunks.
func slabbedRun(t *testing.T, st *store.Store) *record.Record {
	t.Helper()
	chunk := func(c byte) []byte { return bytes.Repeat([]byte{c}, 16<<10) }
	s0 := append(chunk('a'), chunk('b')...)
	s1 := chunk('c')
	idx := store.EncodeSlabIndex([]store.SlabChunk{
		{Vaddr: 0x10000, Size: 16 << 10, Slab: 0, Offset: 0, Address: record.Sum(chunk('a'))},
		{Vaddr: 0x14000, Size: 16 << 10, Slab: 0, Offset: 16 << 10, Address: record.Sum(chunk('b'))},
		{Vaddr: 0x40000, Size: 16 << 10, Slab: 1, Offset: 0, Address: record.Sum(chunk('c'))},
	})
	return imageRun(t, st, "r", map[string][]byte{"rootfs/etc/x": []byte("x")}, map[string][]byte{
		"core-1.img":              []byte("core"),
		"pages-1.img.slabs/index": idx,
		"pages-1.img.slabs/00":    s0,
		"pages-1.img.slabs/01":    s1,
	})
}

// A post-copy stage leaves the last memory image's slabs owed, with their
// chunks from the verified index; the run is judged and stored owing them,
// verifies, and once each is filled, adopted and settled the target holds
// what the source does.
func TestStageOwesSlabs(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	rec := slabbedRun(t, src)
	srv := serve(t, src, nil)
	from := transfer.Source{Client: srv.Client(), Base: srv.URL}
	ctx := context.Background()
	key := record.Sum([]byte("source key"))
	f, stats, err := transfer.Stage(ctx, from, dst, rec, transfer.Options{Owe: key})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	owed := f.Owed()
	if len(owed) != 2 || len(owed[0].Chunks)+len(owed[1].Chunks) != 3 {
		t.Fatalf("owed %+v", owed)
	}
	var slabBytes int64
	for _, o := range owed {
		if !f.Owes(o.Slab.Address) || f.Has(o.Slab.Address) {
			t.Fatalf("slab %s: owed %v, held %v", o.Slab.Name, f.Owes(o.Slab.Address), f.Has(o.Slab.Address))
		}
		slabBytes += int64(o.Slab.Size)
	}
	if want := reached(t, src, rec); stats.Objects != len(want)-2 {
		t.Fatalf("fetched %d objects, want %d (all but the two slabs)", stats.Objects, len(want)-2)
	}
	if _, err := bundle.ImportStored(ctx, f, rec, bundle.StoredOptions{Run: "r"}); err != nil {
		t.Fatal(err)
	}
	o, ok, err := dst.Owed("r")
	if err != nil || !ok || len(o.Slabs) != 2 || o.Source != key || o.Head != rec.Head() || len(o.Listings) != 1 || o.Listings[0] != *rec.Segment(rec.Len() - 1).Snapshot.Memory {
		t.Fatalf("owing %+v %v %v", o, ok, err)
	}
	if _, err := dst.Check(ctx); err != nil {
		t.Fatalf("check of the run owing: %v", err)
	}
	for _, s := range owed {
		ow, err := transfer.NewOwed(dst, from, s.Slab, s.Chunks)
		if err != nil {
			t.Fatal(err)
		}
		if err := ow.Fill(ctx); err != nil {
			t.Fatal(err)
		}
		if err := ow.Adopt(ctx, dst); err != nil {
			t.Fatal(err)
		}
		ow.Close()
		if err := dst.Settle(ctx, "r", s.Slab.Address); err != nil {
			t.Fatal(err)
		}
	}
	if err := dst.Owes("r"); err != nil {
		t.Fatalf("still owing once every slab is settled: %v", err)
	}
	if !sameSet(reached(t, dst, rec), reached(t, src, rec)) {
		t.Fatal("the target does not reach what the source does")
	}
}

// Without Owe, or for a record with no slab form, nothing is owed.
func TestStageOwesNothing(t *testing.T) {
	src := mustStore(t)
	rec := slabbedRun(t, src)
	srv := serve(t, src, nil)
	from := transfer.Source{Client: srv.Client(), Base: srv.URL}
	dst := mustStore(t)
	f, _, err := transfer.Stage(context.Background(), from, dst, rec, transfer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Owed()) != 0 {
		t.Fatalf("owed %v without Owe", f.Owed())
	}
	other := mustStore(t)
	whole := imageRun(t, other, "w", map[string][]byte{"rootfs/x": []byte("x")}, map[string][]byte{"pages-1.img": []byte("pages")})
	srv2 := serve(t, other, nil)
	f2, _, err := transfer.Stage(context.Background(), transfer.Source{Client: srv2.Client(), Base: srv2.URL}, mustStore(t), whole, transfer.Options{Owe: record.Sum([]byte("k"))})
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	if len(f2.Owed()) != 0 {
		t.Fatalf("owed %v of a whole pages file", f2.Owed())
	}
}
