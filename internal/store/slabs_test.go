package store

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Whatever bytes an index holds, DecodeSlabIndex refuses them with
// ErrChunks or returns chunks that keep the form: whole pages of 1 page
// to MaxChunk, in address order and apart, each within a slab that holds
// at least one, ranges of a slab the same or apart.
func FuzzDecodeSlabIndex(f *testing.F) {
	page := bytes.Repeat([]byte{1}, ChunkPage)
	f.Add(EncodeSlabIndex([]SlabChunk{{Vaddr: 0x400000, Size: ChunkPage, Address: record.Sum(page)},
		{Vaddr: 0x402000, Size: ChunkPage, Offset: ChunkPage, Slab: 1, Address: record.Sum(page)}}), uint64(2*ChunkPage), uint64(2*ChunkPage))
	f.Fuzz(func(t *testing.T, b []byte, s0, s1 uint64) {
		slabs := []uint64{s0, s1}
		cs, err := DecodeSlabIndex(b, slabs)
		if err != nil {
			if !errors.Is(err, ErrChunks) {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		used := make([]bool, len(slabs))
		for i, c := range cs {
			if c.Size == 0 || c.Size > MaxChunk || c.Size%ChunkPage != 0 || c.Vaddr%ChunkPage != 0 || c.Offset%ChunkPage != 0 ||
				c.Vaddr+c.Size < c.Vaddr || c.Slab >= len(slabs) || c.Offset+c.Size < c.Offset || c.Offset+c.Size > slabs[c.Slab] {
				t.Fatalf("chunk %d: %+v", i, c)
			}
			if i > 0 && cs[i-1].Vaddr+cs[i-1].Size > c.Vaddr {
				t.Fatalf("chunk %d overlaps", i)
			}
			for _, d := range cs[:i] {
				if d.Slab == c.Slab && d.Offset < c.Offset+c.Size && c.Offset < d.Offset+d.Size && (d.Offset != c.Offset || d.Size != c.Size || d.Address != c.Address) {
					t.Fatalf("chunk %d's range overlaps another's", i)
				}
			}
			used[c.Slab] = true
		}
		for i, u := range used {
			if !u {
				t.Fatalf("slab %d holds no chunk", i)
			}
		}
	})
}

// ChunkedFiles reads a slab-form file through its index, beside a file
// of one object per chunk, and refuses a slab form it cannot read.
func TestChunkedFilesSlabs(t *testing.T) {
	slab := bytes.Repeat([]byte{2}, 3*ChunkPage)
	idx := EncodeSlabIndex([]SlabChunk{
		{Vaddr: 0x1000, Size: ChunkPage, Offset: 2 * ChunkPage, Address: record.Sum(slab[:ChunkPage])},
		{Vaddr: 0x4000, Size: 2 * ChunkPage, Offset: 0, Address: record.Sum(slab[:2*ChunkPage])},
	})
	page := bytes.Repeat([]byte{1}, ChunkPage)
	es := []Entry{chunkEntry(0x400000, page),
		{Name: SlabName("pages-2.img", 0), Mode: 0o600, Size: uint64(len(slab)), Address: record.Sum(slab)},
		{Name: SlabIndexName("pages-2.img"), Mode: 0o640, Size: uint64(len(idx)), Address: record.Sum(idx)}}
	read := func(e Entry) ([]byte, error) { return idx, nil }
	cfs, err := ChunkedFiles(es, read)
	if err != nil || len(cfs) != 2 {
		t.Fatalf("chunked files %+v, %v", cfs, err)
	}
	cf := cfs[1]
	if cf.Name != "pages-2.img" || cf.Size != 3*ChunkPage || cf.Index == nil || len(cf.Slabs) != 1 || len(cf.Chunks) != 2 ||
		cf.Chunks[0].Offset != 2*ChunkPage || cf.Chunks[0].In.Name != SlabName("pages-2.img", 0) || cf.Chunks[1].Mode != 0o640 {
		t.Fatalf("slab-form file %+v", cf)
	}
	if cfs[0].Index != nil || cfs[0].Chunks[0].In != cfs[0].Chunks[0].Entry {
		t.Fatalf("one-object-per-chunk file %+v", cfs[0])
	}
	if _, err := ChunkedFiles(es, nil); !errors.Is(err, ErrChunks) {
		t.Fatalf("a slab form with no index reader: %v", err)
	}
	if _, err := ChunkedFiles(es, func(Entry) ([]byte, error) { return idx[:len(idx)-1], nil }); !errors.Is(err, ErrChunks) {
		t.Fatalf("an index of another size than listed: %v", err)
	}
	if _, err := ChunkedFiles(es[1:2], read); !errors.Is(err, ErrChunks) {
		t.Fatalf("slabs with no index: %v", err)
	}
}

// A listing's chunked files together hold at most MaxListedChunks chunks,
// judged on the indexes' listed sizes before any is read: many slab-form
// files naming one index of MaxChunks chunks over one page of one slab
// would otherwise make a listing of a few entries decode into billions
// of chunks.
func TestChunkedFilesBoundsTheChunksOfAListing(t *testing.T) {
	page := bytes.Repeat([]byte{2}, ChunkPage)
	cs := make([]SlabChunk, MaxChunks)
	for i := range cs {
		cs[i] = SlabChunk{Vaddr: uint64(i) * ChunkPage * 2, Size: ChunkPage, Address: record.Sum(page)}
	}
	idx := EncodeSlabIndex(cs)
	ia, sa := record.Sum(idx), record.Sum(page)
	files := MaxListedChunks/MaxChunks + 1
	var es []Entry
	for f := range files {
		name := fmt.Sprintf("pages-%d.img", f)
		es = append(es, Entry{Name: SlabName(name, 0), Mode: 0o600, Size: ChunkPage, Address: sa},
			Entry{Name: SlabIndexName(name), Mode: 0o600, Size: uint64(len(idx)), Address: ia})
	}
	reads := 0
	_, err := ChunkedFiles(es, func(Entry) ([]byte, error) { reads++; return idx, nil })
	if !errors.Is(err, ErrChunks) || reads != 0 {
		t.Fatalf("%d files of %d chunks each: %v, after %d index reads", files, MaxChunks, err, reads)
	}
	// As many as the bound: decoded.
	reads = 0
	if got, err := ChunkedFiles(es[:2*(files-1)], func(Entry) ([]byte, error) { reads++; return idx, nil }); err != nil || len(got) != files-1 {
		t.Fatalf("%d files: %v", len(got), err)
	}
}
