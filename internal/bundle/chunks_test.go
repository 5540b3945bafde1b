package bundle_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
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

// A migration fetches only the chunks the target lacks: a chunked image
// run moves from a to b, where one of its chunks (under another run's
// name) is held already; the fetch skips it, brings the others once each,
// and b imports the run from its store and checks.
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
	if st.Skipped == 0 || st.Objects != len(b.Objects)-1 {
		t.Fatalf("fetched %+v of %d objects, one held", st, len(b.Objects))
	}
	if _, err := bundle.ImportStored(context.Background(), to, b.Record, bundle.StoredOptions{ImportOptions: iopts(), Run: b.Run, Copy: true}); err != nil {
		t.Fatal(err)
	}
	checkGC(t, to)
}
