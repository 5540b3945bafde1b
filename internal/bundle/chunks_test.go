package bundle_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A listing's chunked files (store.ChunkedFiles) are hostile input: an
// importer refuses, with store.ErrChunks under ErrMalformed and nothing
// stored, every chunk directory that breaks the chunked form, and accepts
// one that keeps it.
func TestStageChunks(t *testing.T) {
	page := bytes.Repeat([]byte{7}, store.ChunkPage)
	two := bytes.Repeat([]byte{9}, 2*store.ChunkPage)
	ent := func(name string, b []byte) store.Entry {
		return store.Entry{Name: name, Mode: 0o600, Size: uint64(len(b)), Address: record.Sum(b)}
	}
	listing := func(es ...store.Entry) []byte {
		b, err := store.EncodeListing(es)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	chunk := func(v uint64, b []byte) store.Entry { return ent(store.ChunkName("pages-1.img", v), b) }
	for name, c := range map[string]struct {
		l     []byte
		files [][]byte
		want  error
	}{
		"accepted": {l: listing(chunk(0x400000, page), chunk(0x401000, two), chunk(0x500000, page)), files: [][]byte{page, two}},
		"a name not sixteen hex digits": {l: listing(ent("pages-1.img.chunks/400000", page)), files: [][]byte{page},
			want: store.ErrChunks},
		"an upper-case name": {l: listing(ent("pages-1.img.chunks/00000000004000A0", page)), files: [][]byte{page},
			want: store.ErrChunks},
		"a directory in the chunks": {l: listing(ent("pages-1.img.chunks/0000000000400000/x", page)), files: [][]byte{page},
			want: store.ErrChunks},
		"an address not a page's": {l: listing(chunk(0x400010, page)), files: [][]byte{page},
			want: store.ErrChunks},
		"a size not whole pages": {l: listing(chunk(0x400000, []byte("pages"))), files: [][]byte{[]byte("pages")},
			want: store.ErrChunks},
		"an empty chunk": {l: listing(chunk(0x400000, nil)), files: [][]byte{nil},
			want: store.ErrChunks},
		"a chunk over the limit": {l: listing(chunk(0x400000, make([]byte, store.MaxChunk+store.ChunkPage))), files: [][]byte{make([]byte, store.MaxChunk+store.ChunkPage)},
			want: store.ErrChunks},
		"overlapping chunks": {l: listing(chunk(0x400000, two), chunk(0x401000, page)), files: [][]byte{page, two},
			want: store.ErrChunks},
		"past the end of the address space": {l: listing(chunk(0xfffffffffffff000, two)), files: [][]byte{two},
			want: store.ErrChunks},
		"whole and in chunks": {l: listing(chunk(0x400000, page), ent("pages-1.img", page)), files: [][]byte{page},
			want: store.ErrChunks},
		"a chunk directory naming no file": {l: listing(ent(".chunks/0000000000400000", page)), files: [][]byte{page},
			want: store.ErrChunks},
	} {
		t.Run(name, func(t *testing.T) {
			st, dir := mustStore(t)
			b := forgeImage(t, c.l, c.files...)
			sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(b.Tar(nil)), opts())
			if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if err != nil {
				if !errors.Is(err, bundle.ErrMalformed) {
					t.Fatalf("%v is not ErrMalformed", err)
				}
				t.Log(err)
				if n, size := objects(t, dir); n != 0 || size != 0 {
					t.Fatalf("refused bundle left %d objects, %d bytes", n, size)
				}
				return
			}
			defer sb.Close()
			if err := sb.Adopt(context.Background(), st); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A bundle carries each chunk once, however many parks' listings name it
// and under however many names: its members are the objects the record
// reaches, each once (bundle.Reached), and a chunk is an ordinary listed
// file.
func TestReachedChunksOnce(t *testing.T) {
	page := bytes.Repeat([]byte{7}, store.ChunkPage)
	other := bytes.Repeat([]byte{8}, store.ChunkPage)
	ent := func(v uint64, b []byte) store.Entry {
		return store.Entry{Name: store.ChunkName("pages-1.img", v), Mode: 0o600, Size: uint64(len(b)), Address: record.Sum(b)}
	}
	l, err := store.EncodeListing([]store.Entry{ent(0x400000, page), ent(0x401000, page), ent(0x402000, other)})
	if err != nil {
		t.Fatal(err)
	}
	b := forgeImage(t, l, page, other)
	st, _ := mustStore(t)
	sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(b.Tar(nil)), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := sb.Adopt(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	reached, err := bundle.Reached(st, b.Record, true)
	if err != nil {
		t.Fatal(err)
	}
	count := map[record.Address]int{}
	for _, a := range reached {
		count[a]++
	}
	if count[record.Sum(page)] != 1 || count[record.Sum(other)] != 1 {
		t.Fatalf("chunks reached %d and %d times, want once each", count[record.Sum(page)], count[record.Sum(other)])
	}
}

// A migration fetches the chunks the target lacks for the run: a chunked
// image run moves from a to b, where one of its chunks is held already,
// not for this run (put by other means); the fetch brings it all the same
// (knowing an address is not holding its bytes) and every other chunk
// once, and b imports the run from its store and checks.
func TestFetchChunksTheTargetLacks(t *testing.T) {
	held, shared, fresh := bytes.Repeat([]byte{1}, store.ChunkPage), bytes.Repeat([]byte{2}, store.ChunkPage), bytes.Repeat([]byte{3}, 4*store.ChunkPage)
	ent := func(v uint64, b []byte) store.Entry {
		return store.Entry{Name: store.ChunkName("pages-1.img", v), Mode: 0o600, Size: uint64(len(b)), Address: record.Sum(b)}
	}
	l, err := store.EncodeListing([]store.Entry{ent(0x400000, held), ent(0x401000, shared), ent(0x402000, shared), ent(0x404000, fresh)})
	if err != nil {
		t.Fatal(err)
	}
	b := forgeImage(t, l, held, shared, fresh)
	from, _ := mustStore(t)
	mustImport(t, from, b.Tar(nil), iopts())
	to, _ := mustStore(t)
	if _, err := to.PutBytes(held); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(transfer.Handler(from))
	defer srv.Close()
	st, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, to, b.Record, transfer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Skipped != 0 || st.Objects != len(b.Objects) {
		t.Fatalf("fetched %+v of %d objects, one held for no run", st, len(b.Objects))
	}
	if _, err := bundle.ImportStored(context.Background(), to, b.Record, bundle.StoredOptions{ImportOptions: iopts(), Run: b.Run, Copy: true}); err != nil {
		t.Fatal(err)
	}
	checkGC(t, to)
}

// A listing's slab form (docs/store.md, "Slabs") is hostile input: every
// byte of an index, its entries' names and the slabs' listed sizes.
// Each forgery is refused with store.ErrChunks under ErrMalformed, and
// nothing is stored; a well-formed one is accepted.
func TestStageSlabs(t *testing.T) {
	slab := bytes.Repeat([]byte{7}, 4*store.ChunkPage)
	two := bytes.Repeat([]byte{9}, 2*store.ChunkPage)
	ent := func(name string, b []byte) store.Entry {
		return store.Entry{Name: name, Mode: 0o600, Size: uint64(len(b)), Address: record.Sum(b)}
	}
	pg := uint64(store.ChunkPage)
	good := []store.SlabChunk{
		{Vaddr: 0x400000, Size: 2 * pg, Offset: 0, Address: record.Sum(slab[:2*pg])},
		{Vaddr: 0x500000, Size: 2 * pg, Offset: 2 * pg, Address: record.Sum(slab[2*pg:])},
	}
	with := func(f func(cs []store.SlabChunk)) []byte {
		cs := append([]store.SlabChunk(nil), good...)
		f(cs)
		return store.EncodeSlabIndex(cs)
	}
	index := store.EncodeSlabIndex(good)
	for name, c := range map[string]struct {
		es    []string // listed: slab 00, index, and these names as more slabs of two
		index []byte
		want  error
	}{
		"accepted":                     {index: index},
		"no magic":                     {index: append([]byte("runrecordd.slabs/2"), index[len(store.SlabMagic):]...), want: store.ErrChunks},
		"a count of zero":              {index: append([]byte(store.SlabMagic), 0, 0, 0, 0), want: store.ErrChunks},
		"a byte past the last":         {index: append(bytes.Clone(index), 0), want: store.ErrChunks},
		"a record cut short":           {index: index[:len(index)-1], want: store.ErrChunks},
		"a size not whole pages":       {index: with(func(cs []store.SlabChunk) { cs[1].Size = pg + 1 }), want: store.ErrChunks},
		"an empty chunk":               {index: with(func(cs []store.SlabChunk) { cs[1].Size = 0 }), want: store.ErrChunks},
		"an offset not a page's":       {index: with(func(cs []store.SlabChunk) { cs[1].Offset = 100 }), want: store.ErrChunks},
		"past the slab's end":          {index: with(func(cs []store.SlabChunk) { cs[1].Offset = 3 * pg }), want: store.ErrChunks},
		"an offset past 2⁶⁴":           {index: with(func(cs []store.SlabChunk) { cs[1].Offset = ^uint64(0) - pg + 1 }), want: store.ErrChunks},
		"addresses out of order":       {index: with(func(cs []store.SlabChunk) { cs[0].Vaddr, cs[1].Vaddr = cs[1].Vaddr, cs[0].Vaddr }), want: store.ErrChunks},
		"overlapping addresses":        {index: with(func(cs []store.SlabChunk) { cs[1].Vaddr = 0x401000 }), want: store.ErrChunks},
		"overlapping ranges of a slab": {index: with(func(cs []store.SlabChunk) { cs[1].Offset = pg }), want: store.ErrChunks},
		"past the address space":       {index: with(func(cs []store.SlabChunk) { cs[1].Vaddr = ^uint64(0) - pg + 1 }), want: store.ErrChunks},
		"a slab not listed":            {index: with(func(cs []store.SlabChunk) { cs[1].Slab = 1 }), want: store.ErrChunks},
		"a slab holding no chunk":      {es: []string{store.SlabName("pages-1.img", 1)}, index: index, want: store.ErrChunks},
		"a slab numbered apart":        {es: []string{store.SlabName("pages-1.img", 2)}, index: index, want: store.ErrChunks},
		"another name in the slabs":    {es: []string{"pages-1.img.slabs/x"}, index: index, want: store.ErrChunks},
		"whole beside its slabs":       {es: []string{"pages-1.img"}, index: index, want: store.ErrChunks},
		"in chunks beside its slabs":   {es: []string{store.ChunkName("pages-1.img", 0x400000)}, index: index, want: store.ErrChunks},
	} {
		t.Run(name, func(t *testing.T) {
			es := []store.Entry{ent(store.SlabName("pages-1.img", 0), slab), ent(store.SlabIndexName("pages-1.img"), c.index)}
			files := [][]byte{slab, c.index}
			for _, n := range c.es {
				es = append(es, ent(n, two))
			}
			if len(c.es) > 0 {
				files = append(files, two)
			}
			slices.SortFunc(es, func(a, b store.Entry) int { return strings.Compare(a.Name, b.Name) })
			l, err := store.EncodeListing(es)
			if err != nil {
				t.Fatal(err)
			}
			st, dir := mustStore(t)
			b := forgeImage(t, l, files...)
			sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(b.Tar(nil)), opts())
			if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if err != nil {
				if !errors.Is(err, bundle.ErrMalformed) {
					t.Fatalf("%v is not ErrMalformed", err)
				}
				if n, size := objects(t, dir); n != 0 || size != 0 {
					t.Fatalf("refused bundle left %d objects, %d bytes", n, size)
				}
				return
			}
			defer sb.Close()
			if err := sb.Adopt(context.Background(), st); err != nil {
				t.Fatal(err)
			}
		})
	}
}
