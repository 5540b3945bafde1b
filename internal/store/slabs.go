package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// The slab form of a chunked file (docs/store.md, "Slabs"): a file NAME
// listed as NAME.slabs/index, its chunk index, and NAME.slabs/00 …
// NAME.slabs/NN, its slabs. A slab is an ordinary file and object holding
// chunks' bytes back to back; the index gives each chunk's virtual
// address, size, slab, offset in it and BLAKE3 address, in address order.
// Laid out, NAME is its chunks' bytes in the index's order. A park's first
// slab is CRIU's pages file itself (renamed, never copied); a later park
// lists the slabs of the park before it that hold its unchanged chunks
// and one new slab of the chunks that changed.
const (
	// SlabSuffix ends the name of a slab-form file's directory.
	SlabSuffix = ".slabs"
	// SlabIndexBase is the index's name in that directory.
	SlabIndexBase = "index"
	// MaxSlabs is the most slabs of one file.
	MaxSlabs = 16
	// SlabMagic starts an index.
	SlabMagic = "runrecordd.slabs/1"
	// slabHeader is the index's header: the magic and a u32 count.
	slabHeader = len(SlabMagic) + 4
	// SlabRecord is one chunk's bytes in the index: u64 vaddr, u32 size,
	// u8 slab, u64 offset, 32-byte address.
	SlabRecord = 8 + 4 + 1 + 8 + 32
	// MaxSlabIndex is the largest index: MaxChunks records.
	MaxSlabIndex = slabHeader + MaxChunks*SlabRecord
)

// SlabChunk is one record of an index.
type SlabChunk struct {
	Vaddr   uint64
	Size    uint64
	Slab    int
	Offset  uint64
	Address record.Address
}

// SlabName is the listing's name of slab i of file name.
func SlabName(name string, i int) string { return fmt.Sprintf("%s%s/%02d", name, SlabSuffix, i) }

// SlabIndexName is the listing's name of file name's index.
func SlabIndexName(name string) string { return name + SlabSuffix + "/" + SlabIndexBase }

// EncodeSlabIndex encodes cs as an index. It does not check the rules:
// [DecodeSlabIndex] does.
func EncodeSlabIndex(cs []SlabChunk) []byte {
	b := make([]byte, 0, slabHeader+len(cs)*SlabRecord)
	b = append(b, SlabMagic...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(cs)))
	for _, c := range cs {
		b = binary.BigEndian.AppendUint64(b, c.Vaddr)
		b = binary.BigEndian.AppendUint32(b, uint32(c.Size))
		b = append(b, byte(c.Slab))
		b = binary.BigEndian.AppendUint64(b, c.Offset)
		b = append(b, c.Address[:]...)
	}
	return b
}

// DecodeSlabIndex decodes an index of a file whose slabs have the sizes
// slabs, checking every rule of the form (a refusal wraps [ErrChunks]):
// the magic; 1 to [MaxChunks] records and no byte past the last; each
// chunk whole pages of 1 page to [MaxChunk], not past 2⁶⁴, above the end
// of the one before it; its slab one of slabs, its offset whole pages and
// its range within the slab; every slab holding a chunk; and two ranges
// of one slab the same (offset, size and address) or apart.
func DecodeSlabIndex(b []byte, slabs []uint64) ([]SlabChunk, error) {
	if len(b) < slabHeader || string(b[:len(SlabMagic)]) != SlabMagic {
		return nil, fmt.Errorf("%w: an index starts with %q and a count", ErrChunks, SlabMagic)
	}
	n := binary.BigEndian.Uint32(b[len(SlabMagic):])
	if n == 0 || n > MaxChunks {
		return nil, fmt.Errorf("%w: an index of %d chunks: it holds 1 to %d", ErrChunks, n, MaxChunks)
	}
	if uint64(len(b)) != uint64(slabHeader)+uint64(n)*SlabRecord {
		return nil, fmt.Errorf("%w: an index of %d chunks is %d bytes, not %d", ErrChunks, n, len(b), slabHeader+int(n)*SlabRecord)
	}
	cs := make([]SlabChunk, n)
	used := make([]bool, len(slabs))
	var end uint64
	for i := range cs {
		r := b[slabHeader+i*SlabRecord:]
		c := SlabChunk{Vaddr: binary.BigEndian.Uint64(r), Size: uint64(binary.BigEndian.Uint32(r[8:])), Slab: int(r[12]),
			Offset: binary.BigEndian.Uint64(r[13:])}
		copy(c.Address[:], r[21:SlabRecord])
		switch {
		case c.Vaddr%ChunkPage != 0 || c.Size%ChunkPage != 0 || c.Offset%ChunkPage != 0:
			return nil, fmt.Errorf("%w: chunk %d: address %#x, size %d, offset %d: not whole pages of %d bytes", ErrChunks, i, c.Vaddr, c.Size, c.Offset, ChunkPage)
		case c.Size == 0 || c.Size > MaxChunk:
			return nil, fmt.Errorf("%w: chunk %d: %d bytes: a chunk holds 1 to %d", ErrChunks, i, c.Size, MaxChunk)
		case c.Vaddr+c.Size < c.Vaddr:
			return nil, fmt.Errorf("%w: chunk %d: address %#x, size %d: past the end of the address space", ErrChunks, i, c.Vaddr, c.Size)
		case i > 0 && c.Vaddr < end:
			return nil, fmt.Errorf("%w: chunk %d: address %#x overlaps or comes before the chunk before it", ErrChunks, i, c.Vaddr)
		case c.Slab >= len(slabs):
			return nil, fmt.Errorf("%w: chunk %d: slab %d of %d", ErrChunks, i, c.Slab, len(slabs))
		case c.Offset > slabs[c.Slab] || c.Size > slabs[c.Slab]-c.Offset:
			return nil, fmt.Errorf("%w: chunk %d: %d bytes at %d of slab %d, which has %d", ErrChunks, i, c.Size, c.Offset, c.Slab, slabs[c.Slab])
		}
		end = c.Vaddr + c.Size
		used[c.Slab] = true
		cs[i] = c
	}
	if i := slices.Index(used, false); i >= 0 {
		return nil, fmt.Errorf("%w: slab %d holds no chunk of the index", ErrChunks, i)
	}
	order := make([]int, len(cs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int {
		a, b := cs[x], cs[y]
		if a.Slab != b.Slab {
			return a.Slab - b.Slab
		}
		if a.Offset != b.Offset {
			if a.Offset < b.Offset {
				return -1
			}
			return 1
		}
		return int(a.Size>>12) - int(b.Size>>12)
	})
	for k := 1; k < len(order); k++ {
		p, c := cs[order[k-1]], cs[order[k]]
		if p.Slab == c.Slab && c.Offset < p.Offset+p.Size && (c.Offset != p.Offset || c.Size != p.Size || c.Address != p.Address) {
			return nil, fmt.Errorf("%w: chunks %d and %d: ranges %d+%d and %d+%d of slab %d overlap", ErrChunks, order[k-1], order[k], p.Offset, p.Size, c.Offset, c.Size, c.Slab)
		}
	}
	return cs, nil
}

// slabFile gathers the entries of one file's slab form as a listing gives
// them.
type slabFile struct {
	name  string
	slabs []Entry
	index *Entry
}

// addSlabEntry adds entry e, named NAME.slabs/base, to f.
func (f *slabFile) add(base string, e Entry) error {
	if base == SlabIndexBase {
		if f.index != nil {
			return errors.New("the index is listed twice")
		}
		f.index = &e
		return nil
	}
	if len(base) != 2 || base[0] < '0' || base[0] > '9' || base[1] < '0' || base[1] > '9' {
		return fmt.Errorf("a slab-form entry is %s or a slab's two-digit number", SlabIndexBase)
	}
	i := int(base[0]-'0')*10 + int(base[1]-'0')
	if i != len(f.slabs) || i >= MaxSlabs {
		return fmt.Errorf("slab %d after %d slabs: they are numbered 00 on, at most %d", i, len(f.slabs), MaxSlabs)
	}
	f.slabs = append(f.slabs, e)
	return nil
}

// chunked decodes f's index (its bytes b) into the chunked file laid out.
func (f *slabFile) chunked(b []byte) (ChunkedFile, error) {
	if f.index == nil {
		return ChunkedFile{}, fmt.Errorf("%w: %q has slabs and no %s", ErrChunks, f.name, SlabIndexBase)
	}
	if len(f.slabs) == 0 {
		return ChunkedFile{}, fmt.Errorf("%w: %q has an index and no slab", ErrChunks, f.name)
	}
	if uint64(len(b)) != f.index.Size {
		return ChunkedFile{}, fmt.Errorf("%w: the index of %q is %d bytes, listed as %d", ErrChunks, f.name, len(b), f.index.Size)
	}
	sizes := make([]uint64, len(f.slabs))
	for i, s := range f.slabs {
		sizes[i] = s.Size
	}
	cs, err := DecodeSlabIndex(b, sizes)
	if err != nil {
		return ChunkedFile{}, fmt.Errorf("%q: %w", f.name, err)
	}
	idx := *f.index
	cf := ChunkedFile{Name: f.name, Index: &idx, Slabs: f.slabs, Chunks: make([]Chunk, len(cs))}
	for i, c := range cs {
		cf.Chunks[i] = Chunk{Vaddr: c.Vaddr, Entry: Entry{Name: ChunkName(f.name, c.Vaddr), Mode: idx.Mode, Size: c.Size, Address: c.Address},
			In: f.slabs[c.Slab], Offset: c.Offset}
		cf.Size += c.Size
	}
	return cf, nil
}

// ReadIndex reads index e's bytes from the store, verified, for
// [ChunkedFiles]: at most [MaxSlabIndex] of them.
func (s *Store) ReadIndex(e Entry) ([]byte, error) {
	if e.Size > uint64(MaxSlabIndex) {
		return nil, fmt.Errorf("%w: an index of %d bytes, more than %d", ErrChunks, e.Size, MaxSlabIndex)
	}
	return s.ReadAll(e.Address)
}

// SumRange is the BLAKE3 of size bytes at off of object a's file, as the
// disk holds them (not the object's verification: a's other bytes are
// not read).
func (s *Store) SumRange(a record.Address, off, size uint64) (record.Address, error) {
	f, err := os.Open(s.Path(a))
	if err != nil {
		return record.Address{}, notFound(a, err)
	}
	defer f.Close()
	b := make([]byte, size)
	if _, err := f.ReadAt(b, int64(off)); err != nil {
		return record.Address{}, fmt.Errorf("object %s: %d bytes at %d: %w", a, size, off, err)
	}
	return record.Sum(b), nil
}
