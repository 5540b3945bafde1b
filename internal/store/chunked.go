package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// The chunked forms of a file in a directory object (docs/store.md,
// "Chunked files"): the slab form (slabs.go), which parks write, and the
// form of one object per chunk, read and never written: a file NAME is
// listed, instead of whole, as the entries NAME.chunks/VVVVVVVVVVVVVVVV,
// one per chunk, where the sixteen
// lower-case hex digits are the virtual address of the chunk's first byte.
// Each chunk is an ordinary file of the listing, and so an ordinary
// object, reached, collected, verified, bundled and fetched as any listed
// file is. Laid out for a reader, the chunks are concatenated in address
// order (which is the listing's byte order) into NAME.
const (
	// ChunkSuffix ends the name of a chunked file's directory.
	ChunkSuffix = ".chunks"
	// ChunkPage is the unit of a chunk's address and size.
	ChunkPage = 4096
	// MaxChunk is the largest chunk.
	MaxChunk = 1 << 20
	// MaxChunks is the most chunks of one file: 8 GiB at 16 KiB.
	MaxChunks = 1 << 19
	// MaxListedChunks is the most chunks of one listing's chunked files
	// together: as many as a listing holds entries, which bounds the
	// form of one file per chunk already. A slab-form file's chunks are
	// counted from its index's listed size, before any index is read.
	MaxListedChunks = MaxEntries
)

// ErrChunks is a chunked file whose chunks break the rules of the chunked
// form: a chunk name that is not sixteen lower-case hex digits, a
// directory deeper than NAME.chunks/, an address or size that is not a
// whole number of pages, an empty chunk or one over [MaxChunk], more than
// [MaxChunks] chunks, a range past the end of the address space or
// overlapping the one before it, or NAME listed beside NAME.chunks/.
var ErrChunks = errors.New("chunked file refused")

// Chunk is one chunk of a chunked file: its virtual address, its entry
// (the listing's, or in the slab form one made from its index record,
// named as [ChunkName] names it, with the index's mode), and where its
// bytes are: at Offset of In, the listed file holding them (the chunk
// itself, at 0, or its slab).
type Chunk struct {
	Vaddr uint64
	Entry
	In     Entry
	Offset uint64
}

// ChunkedFile is a file a listing holds in the chunked form.
type ChunkedFile struct {
	Name   string  // the file laid out: NAME, without the suffix
	Size   uint64  // the sum of its chunks' sizes
	Chunks []Chunk // in address order
	// Index and Slabs are the entries of the slab form; Index is nil in
	// the form of one file per chunk.
	Index *Entry
	Slabs []Entry
}

// InChunkedForm is whether a listing's entry name is part of a chunked
// file: a chunk (NAME.chunks/…), a slab or an index (NAME.slabs/…), with
// NAME at the top level.
func InChunkedForm(name string) bool {
	dir, _, ok := strings.Cut(name, "/")
	return ok && (strings.HasSuffix(dir, ChunkSuffix) || strings.HasSuffix(dir, SlabSuffix))
}

// ChunkName is the listing's name of the chunk at vaddr of file name.
func ChunkName(name string, vaddr uint64) string {
	return fmt.Sprintf("%s%s/%016x", name, ChunkSuffix, vaddr)
}

// ChunkedFiles returns the files es (a listing's entries, in its order)
// holds in a chunked form, checking every rule of the form: a refusal
// wraps [ErrChunks]. An entry is a chunk when its first name component is
// NAME.chunks, and part of the slab form when it is NAME.slabs; NAME must
// then be a file's name (not empty, "." or ".."): chunked files are at a
// listing's top level, as CRIU's image directory is flat. Other entries, a
// deeper NAME.chunks/ included, are ordinary files and left alone. index
// reads a slab-form file's index ([Store.ReadIndex]); a listing with one
// is refused when it is nil. The files of one-file-per-chunk come first,
// in the listing's order, then those of the slab form.
func ChunkedFiles(es []Entry, index func(Entry) ([]byte, error)) ([]ChunkedFile, error) {
	var out []ChunkedFile
	var slabbed []*slabFile
	whole := map[string]bool{}
	seen := map[string]bool{}
	for i, e := range es {
		dir, base, ok := strings.Cut(e.Name, "/")
		if ok && strings.HasSuffix(dir, SlabSuffix) {
			name := strings.TrimSuffix(dir, SlabSuffix)
			if name == "" || name == "." || name == ".." {
				return nil, fmt.Errorf("%w: %q: a slab directory names no file", ErrChunks, e.Name)
			}
			if len(slabbed) == 0 || slabbed[len(slabbed)-1].name != name {
				if seen[name] {
					return nil, fmt.Errorf("%w: %q: %q is listed in two forms, or its entries apart", ErrChunks, e.Name, name)
				}
				seen[name] = true
				slabbed = append(slabbed, &slabFile{name: name})
			}
			if err := slabbed[len(slabbed)-1].add(base, e); err != nil {
				return nil, fmt.Errorf("%w: %q: %v", ErrChunks, e.Name, err)
			}
			continue
		}
		if !ok || !strings.HasSuffix(dir, ChunkSuffix) {
			whole[e.Name] = true
			continue
		}
		name := strings.TrimSuffix(dir, ChunkSuffix)
		if name == "" || name == "." || name == ".." {
			return nil, fmt.Errorf("%w: %q: a chunk directory names no file", ErrChunks, e.Name)
		}
		if len(out) == 0 || out[len(out)-1].Name != name {
			if seen[name] {
				return nil, fmt.Errorf("%w: %q: the chunks of %q are not listed together", ErrChunks, e.Name, name)
			}
			seen[name] = true
			out = append(out, ChunkedFile{Name: name, Chunks: make([]Chunk, 0, chunksFrom(es[i:], dir))})
		}
		f := &out[len(out)-1]
		if err := f.add(base, e); err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrChunks, e.Name, err)
		}
	}
	total := 0
	for _, f := range out {
		total += len(f.Chunks)
	}
	for _, f := range slabbed {
		if f.index != nil && f.index.Size > uint64(slabHeader) {
			total += int(min(f.index.Size-uint64(slabHeader), uint64(MaxSlabIndex)) / SlabRecord)
		}
		if total > MaxListedChunks {
			return nil, fmt.Errorf("%w: the chunked files of a listing hold more than %d chunks", ErrChunks, MaxListedChunks)
		}
	}
	for _, f := range slabbed {
		if index == nil {
			return nil, fmt.Errorf("%w: %q: the slab form is not read here", ErrChunks, f.name)
		}
		var b []byte
		var err error
		if f.index != nil {
			if b, err = index(*f.index); err != nil {
				return nil, fmt.Errorf("%q: %w", f.name, err)
			}
		}
		cf, err := f.chunked(b)
		if err != nil {
			return nil, err
		}
		out = append(out, cf)
	}
	for _, f := range out {
		if whole[f.Name] {
			return nil, fmt.Errorf("%w: %q is listed both whole and in chunks", ErrChunks, f.Name)
		}
	}
	return out, nil
}

// chunksFrom is how many entries from the start of es are in directory
// dir: the chunks of one file, listed together.
func chunksFrom(es []Entry, dir string) int {
	n := 0
	for n < len(es) && len(es[n].Name) > len(dir) && es[n].Name[len(dir)] == '/' && strings.HasPrefix(es[n].Name, dir) {
		n++
	}
	return min(n, MaxChunks)
}

// add appends the chunk base names to f, after the chunks before it.
func (f *ChunkedFile) add(base string, e Entry) error {
	if len(base) != 16 || strings.ToLower(base) != base {
		return errors.New("a chunk's name is its address as sixteen lower-case hex digits")
	}
	v, err := strconv.ParseUint(base, 16, 64)
	if err != nil {
		return errors.New("a chunk's name is its address as sixteen lower-case hex digits")
	}
	switch {
	case len(f.Chunks) == MaxChunks:
		return fmt.Errorf("more than %d chunks", MaxChunks)
	case v%ChunkPage != 0 || e.Size%ChunkPage != 0:
		return fmt.Errorf("address %#x, size %d: not whole pages of %d bytes", v, e.Size, ChunkPage)
	case e.Size == 0 || e.Size > MaxChunk:
		return fmt.Errorf("%d bytes: a chunk holds 1 to %d", e.Size, MaxChunk)
	case v+e.Size < v:
		return fmt.Errorf("address %#x, size %d: past the end of the address space", v, e.Size)
	}
	if n := len(f.Chunks); n > 0 {
		last := f.Chunks[n-1]
		if last.Vaddr+last.Size > v {
			return fmt.Errorf("address %#x overlaps the chunk at %#x of %d bytes", v, last.Vaddr, last.Size)
		}
	}
	f.Chunks = append(f.Chunks, Chunk{Vaddr: v, Entry: e, In: e})
	f.Size += e.Size
	return nil
}

// IngestChunks is [Store.IngestHashed] for a tree some of whose files the
// caller found already stored: each entry of stored names an object the
// store holds (by its address, which the caller computed from bytes it
// read, as for known), or one of the staged files' addresses, and is
// listed beside the staged files without a staged copy of its own: how an
// image park lists the slabs of its base that hold its unchanged chunks
// (docs/store.md, "Slabs"). Each object stored names must be held
// when the listing is named, else the ingest is refused with
// [ErrMissingObject]; the ones held have their time refreshed, as a file
// Ingest finds stored has, so that no collection takes them before the
// segment naming the listing is appended.
func (s *Store) IngestChunks(ctx context.Context, staging string, known map[string]Hashed, stored []Entry) (record.Address, IngestStats, error) {
	return s.ingest(ctx, staging, known, stored)
}

// keepStored returns stored's objects and counts them in st, with s.gc
// held, after checking that each is held, or is the address of a staged
// file (staged, which the ingest names next), and refreshing its time.
func (s *Store) keepStored(stored, staged []Entry, st *IngestStats) ([]record.Address, error) {
	now := time.Now()
	refs := make([]record.Address, 0, len(stored))
	var inTree map[record.Address]bool
	for _, e := range stored {
		if !s.Has(e.Address) {
			if inTree == nil {
				inTree = make(map[record.Address]bool, len(staged))
				for _, f := range staged {
					inTree[f.Address] = true
				}
			}
			if !inTree[e.Address] {
				return nil, fmt.Errorf("%w: %s (%q)", ErrMissingObject, e.Address, e.Name)
			}
		} else if err := os.Chtimes(s.Path(e.Address), now, now); err != nil {
			return nil, err
		}
		refs = append(refs, e.Address)
		st.Files++
		st.Bytes += int64(e.Size)
	}
	return refs, nil
}

// chunking is whether image parks into this store store their pages files
// chunked ([Store.SetChunkedImages]).
type chunking struct{ on atomic.Bool }

// SetChunkedImages says whether an image park into this store keeps its
// memory pages in the chunked form (serve --chunked-images). The store
// reads and keeps either form whatever the setting; it is the park's.
func (s *Store) SetChunkedImages(on bool) { s.chunking.on.Store(on) }

// ChunkedImages is the setting [Store.SetChunkedImages] made.
func (s *Store) ChunkedImages() bool { return s.chunking.on.Load() }
