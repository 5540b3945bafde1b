package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func chunkEntry(v uint64, b []byte) Entry {
	return Entry{Name: ChunkName("pages-1.img", v), Mode: 0o600, Size: uint64(len(b)), Address: record.Sum(b)}
}

// ChunkedFiles reads a listing's chunked files in address order and their
// sizes; other entries are left alone.
func TestChunkedFiles(t *testing.T) {
	page, two := bytes.Repeat([]byte{1}, ChunkPage), bytes.Repeat([]byte{2}, 2*ChunkPage)
	l, err := EncodeListing([]Entry{chunkEntry(0x401000, two), chunkEntry(0x400000, page),
		{Name: "core-1.img", Size: 4, Address: record.Sum([]byte("core"))},
		{Name: "pages-2.img.chunks/00007fff00000000", Size: ChunkPage, Address: record.Sum(page)}})
	if err != nil {
		t.Fatal(err)
	}
	es, err := DecodeListing(l)
	if err != nil {
		t.Fatal(err)
	}
	cfs, err := ChunkedFiles(es, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfs) != 2 || cfs[0].Name != "pages-1.img" || cfs[0].Size != 3*ChunkPage || len(cfs[0].Chunks) != 2 ||
		cfs[0].Chunks[0].Vaddr != 0x400000 || cfs[0].Chunks[1].Vaddr != 0x401000 ||
		cfs[1].Name != "pages-2.img" || cfs[1].Chunks[0].Vaddr != 0x7fff00000000 {
		t.Fatalf("chunked files %+v", cfs)
	}
}

// More chunks than MaxChunks are refused (the other refusals are the
// bundle importer's test, bundle.TestStageChunks).
func TestChunkedFilesLimit(t *testing.T) {
	sum := record.Sum(bytes.Repeat([]byte{1}, ChunkPage)) // once: 2¹⁹ hashes are most of the test's time
	es := make([]Entry, MaxChunks+1)
	for i := range es {
		es[i] = Entry{Name: ChunkName("pages-1.img", uint64(i)*ChunkPage), Mode: 0o600, Size: ChunkPage, Address: sum}
	}
	if _, err := ChunkedFiles(es[:MaxChunks], nil); err != nil {
		t.Fatalf("%d chunks: %v", MaxChunks, err)
	}
	if _, err := ChunkedFiles(es, nil); !errors.Is(err, ErrChunks) {
		t.Fatalf("%d chunks: %v", len(es), err)
	}
}

// IngestChunks lists objects the store holds beside the staged files,
// without a staged copy, refreshing their time for GC's grace; a stored
// entry naming an object the store lacks is refused before anything is
// named.
func TestIngestChunks(t *testing.T) {
	s := mustStore(t)
	held := bytes.Repeat([]byte{3}, ChunkPage)
	a, err := s.PutBytes(held)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := chtimes(s.Path(a), old); err != nil {
		t.Fatal(err)
	}
	fresh := bytes.Repeat([]byte{4}, ChunkPage)
	stage, _ := s.StagingDir("img")
	if err := os.MkdirAll(filepath.Join(stage, "pages-1.img.chunks"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stage, ChunkName("pages-1.img", 0x401000)), fresh, 0o600); err != nil {
		t.Fatal(err)
	}
	dir, st, err := s.IngestChunks(t.Context(), stage, nil, []Entry{chunkEntry(0x400000, held)})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 2 || st.New != 1 || st.Bytes != 2*ChunkPage || st.NewBytes != ChunkPage {
		t.Fatalf("stats %+v", st)
	}
	es, err := s.Listing(dir)
	if err != nil || len(es) != 2 || es[0].Address != a || es[1].Address != record.Sum(fresh) {
		t.Fatalf("listing %+v, %v", es, err)
	}
	if refs, _ := s.Refs(dir); len(refs) != 2 {
		t.Fatalf("refs %v", refs)
	}
	if info, err := os.Stat(s.Path(a)); err != nil || !info.ModTime().After(old.Add(time.Minute)) {
		t.Fatalf("a held chunk's time was not refreshed: %v", err)
	}

	// A stored entry the store lacks: refused, nothing named.
	stage, _ = s.StagingDir("img")
	other := bytes.Repeat([]byte{5}, ChunkPage)
	if err := os.WriteFile(filepath.Join(stage, "core-1.img"), other, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := chunkEntry(0x400000, bytes.Repeat([]byte{6}, ChunkPage))
	if _, _, err := s.IngestChunks(t.Context(), stage, nil, []Entry{missing}); !errors.Is(err, ErrMissingObject) {
		t.Fatalf("ingest naming a missing object: %v", err)
	}
	if s.Has(record.Sum(other)) {
		t.Fatal("a refused ingest named a staged file")
	}
}

// A park's chunks are ordinary listed files: GC keeps every chunk a
// retained snapshot reaches, shared ones included, and Check rehashes
// them (a damaged chunk is reported).
func TestChunksGCAndCheck(t *testing.T) {
	s := mustStore(t)
	h := mustCreate(t, s, "r")
	receipt, journal := put(t, s, "receipt"), put(t, s, "journal")
	att := put(t, s, "attestation", receipt, journal)
	shared := bytes.Repeat([]byte{7}, ChunkPage)
	stage, _ := s.StagingDir("img")
	os.MkdirAll(filepath.Join(stage, "pages-1.img.chunks"), 0o700)
	os.WriteFile(filepath.Join(stage, ChunkName("pages-1.img", 0x400000)), shared, 0o600)
	dir1, _, err := s.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	stage, _ = s.StagingDir("img")
	dir2, _, err := s.IngestChunks(t.Context(), stage, nil, []Entry{chunkEntry(0x400000, shared), chunkEntry(0x500000, shared)})
	if err != nil {
		t.Fatal(err)
	}
	man := put(t, s, "manifest")
	h = mustAppend(t, s, "r", h, record.Execution(att, nil))
	mustAppend(t, s, "r", h, record.Suspension(record.ImageSnapshot(dir2, nil), man))
	if err := chtimes(s.Path(dir1), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(t.Context(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if s.Has(dir1) || !s.Has(dir2) || !s.Has(record.Sum(shared)) {
		t.Fatalf("after gc: first listing %v, second %v, shared chunk %v", s.Has(dir1), s.Has(dir2), s.Has(record.Sum(shared)))
	}
	if _, err := s.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	damage(t, s, record.Sum(shared), flipByte(100))
	if _, err := s.Check(t.Context()); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrDamaged) {
		t.Fatalf("check over a damaged chunk: %v", err)
	}
	damage(t, s, record.Sum(shared), flipByte(100))
}

// The chunked form of docs/store.md's worked example: a pages file of six
// pages, one at 0x400000 and five from 0x7f0000003000, listed as three
// chunks cut where the address crosses a multiple of 16 KiB, beside the
// image's core file. Each chunk's pages are filled with its first page's
// number (vaddr/4096, low byte).
func ExampleChunkName() {
	fill := func(v uint64, pages int) []byte { return bytes.Repeat([]byte{byte(v / ChunkPage)}, pages*ChunkPage) }
	es := []Entry{{Name: "core-1.img", Mode: 0o600, Size: 4, Address: record.Sum([]byte("core"))}}
	for _, c := range []struct {
		v     uint64
		pages int
	}{{0x400000, 1}, {0x7f0000003000, 1}, {0x7f0000004000, 4}} {
		b := fill(c.v, c.pages)
		es = append(es, Entry{Name: ChunkName("pages-1.img", c.v), Mode: 0o600, Size: uint64(len(b)), Address: record.Sum(b)})
	}
	l, _ := EncodeListing(es)
	b := l[len(DirDomain)+4:]
	for range es {
		n := int(binary.BigEndian.Uint32(b))
		fmt.Printf("%x %s %x %x %x\n", b[:4], b[4:4+n], b[4+n:8+n], b[8+n:16+n], b[16+n:48+n])
		b = b[48+n:]
	}
	fmt.Println(record.Sum(l))
	cfs, _ := ChunkedFiles(es, nil)
	fmt.Println(cfs[0].Name, cfs[0].Size, len(cfs[0].Chunks))
	// Output:
	// 0000000a core-1.img 00000180 0000000000000004 23460271b9ea508d1c6d86a5a45a00594d17c96b0795d4d00e1c1dd5d0f9cfaa
	// 00000023 pages-1.img.chunks/0000000000400000 00000180 0000000000001000 b6fb73fc46938c981e2b0b4b1ef282adcfc89854d01bfe3972fdc4785b41b2c7
	// 00000023 pages-1.img.chunks/00007f0000003000 00000180 0000000000001000 3cf2a07e10dc2a6e0911e13c3202d28dc3cc81b1d54387277c85010ab5cc289a
	// 00000023 pages-1.img.chunks/00007f0000004000 00000180 0000000000004000 4c9c6f466579694f78bda852a16d031d846f0257a9065c65262d0921c1a73255
	// b3:tv0GmoQTaWGmWl7DaBuvNpjZjQ3jRo4PPAWmJddFQnw
	// pages-1.img 24576 3
}

// Whatever listing decodes, ChunkedFiles either refuses it with ErrChunks
// or returns files whose chunks keep the form: whole pages of 1 page to
// MaxChunk, in address order, none overlapping or past 2⁶⁴, sizes summed.
func FuzzChunkedFiles(f *testing.F) {
	page := bytes.Repeat([]byte{1}, ChunkPage)
	seed, _ := EncodeListing([]Entry{chunkEntry(0x400000, page), chunkEntry(0x401000, page),
		{Name: "core-1.img", Size: 4, Address: record.Sum([]byte("core"))}})
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := DecodeListing(b)
		if err != nil {
			return
		}
		cfs, err := ChunkedFiles(es, nil)
		if err != nil {
			if !errors.Is(err, ErrChunks) {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		for _, cf := range cfs {
			var sum uint64
			for i, c := range cf.Chunks {
				if c.Size == 0 || c.Size > MaxChunk || c.Size%ChunkPage != 0 || c.Vaddr%ChunkPage != 0 || c.Vaddr+c.Size < c.Vaddr {
					t.Fatalf("%q: chunk %+v", cf.Name, c)
				}
				if i > 0 && cf.Chunks[i-1].Vaddr+cf.Chunks[i-1].Size > c.Vaddr {
					t.Fatalf("%q: chunk %d overlaps", cf.Name, i)
				}
				sum += c.Size
			}
			if sum != cf.Size || len(cf.Chunks) > MaxChunks {
				t.Fatalf("%q: %d chunks, size %d, summed %d", cf.Name, len(cf.Chunks), cf.Size, sum)
			}
		}
	})
}

// Which entries are chunks (docs/store.md, "Chunked files"): exactly those
// whose first name component is NAME.chunks, NAME a file name (not empty,
// ".", ".."); each must then be a chunk by every rule. A deeper name
// ending in .chunks/ is an ordinary file, listed whole.
func TestWhichEntriesAreChunks(t *testing.T) {
	page := bytes.Repeat([]byte{1}, ChunkPage)
	entry := func(name string) Entry {
		return Entry{Name: name, Mode: 0o600, Size: ChunkPage, Address: record.Sum(page)}
	}
	for _, c := range []struct {
		name    string
		chunked string // the chunked file's NAME; "" for an ordinary file
		refused bool
	}{
		{"pages-1.img.chunks/0000000000400000", "pages-1.img", false},
		{"img/pages-1.img.chunks/0000000000400000", "", false},
		{"img/pages-1.img.chunks/zz", "", false},
		{"a.chunks", "", false},
		{"a.chunksx/zz", "", false},
		{"pages-1.img.chunks/zz", "", true},
		{"pages-1.img.chunks/0000000000400000/x", "", true},
		{"pages-1.img.chunks/0000000000400000.x", "", true},
		{".chunks/0000000000400000", "", true},
		{"..chunks/0000000000400000", "", true},
		{"...chunks/0000000000400000", "", true},
	} {
		cfs, err := ChunkedFiles([]Entry{entry(c.name)}, nil)
		switch {
		case c.refused:
			if !errors.Is(err, ErrChunks) {
				t.Errorf("%q: err = %v, want ErrChunks", c.name, err)
			}
		case err != nil:
			t.Errorf("%q: %v", c.name, err)
		case c.chunked == "" && len(cfs) != 0:
			t.Errorf("%q: read as a chunk of %q, want an ordinary file", c.name, cfs[0].Name)
		case c.chunked != "" && (len(cfs) != 1 || cfs[0].Name != c.chunked):
			t.Errorf("%q: chunked files %v, want %q", c.name, cfs, c.chunked)
		}
	}
}
