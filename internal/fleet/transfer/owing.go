package transfer

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A post-copy fetch (Options.Owe) stages everything the record reaches but
// the slabs of its last snapshot's memory image: the memory listing, its
// indexes and every other file are fetched and verified before the run is
// stored, and the slabs are owed, brought in behind the unit chunk by
// chunk, each chunk verified against its index record ([Owed]).

// OwedSlab is a slab a post-copy fetch left owed: its listed entry, and
// the chunks of the verified index that it holds ([NewOwed]).
type OwedSlab struct {
	Slab   store.Entry
	Chunks []store.SlabChunk
}

// Owed are the slabs the fetch left owed, in the memory listing's order;
// none unless Options.Owe was set.
func (f *Fetched) Owed() []OwedSlab { return slices.Clone(f.owed) }

// Owes says whether a is a slab the fetch left owed
// (bundle.Owing).
func (f *Fetched) Owes(a record.Address) bool {
	return slices.ContainsFunc(f.owed, func(o OwedSlab) bool { return o.Slab.Address == a })
}

// isSlab is whether a listing's entry is a slab (NAME.slabs/NN), not an
// index.
func isSlab(name string) bool {
	dir, base, ok := strings.Cut(name, "/")
	return ok && strings.HasSuffix(dir, store.SlabSuffix) && base != store.SlabIndexBase
}

// findOwed reads the last snapshot's memory listing, if rec ends parked
// as an image with one, and marks its slabs owed to source.
func (f *fetcher) findOwed(rec *record.Record, source record.Address) error {
	mem, ok := lastMemory(rec)
	if !ok {
		return nil
	}
	b, _, err := f.document(mem)
	if err != nil {
		return err
	}
	es, err := store.DecodeListing(b)
	if err != nil {
		return fmt.Errorf("transfer: listing %s: %w: %w", mem, ErrMalformed, err)
	}
	f.pre = map[record.Address][]byte{mem: b}
	f.owe = map[record.Address]store.Entry{}
	for _, e := range es {
		if isSlab(e.Name) {
			f.owe[e.Address] = e
		}
	}
	f.out.owing.Source, f.out.owing.Head = source, rec.Head()
	return nil
}

// lastMemory is the memory listing of rec's last segment, a park.
func lastMemory(rec *record.Record) (record.Address, bool) {
	if rec.Len() == 0 {
		return record.Address{}, false
	}
	s := rec.Segment(rec.Len() - 1)
	if s.Kind != record.Suspended || s.Snapshot.IsTranscript() || s.Snapshot.Memory == nil {
		return record.Address{}, false
	}
	return *s.Snapshot.Memory, true
}

// owes says whether listing l's entry e is an owed slab: then it is not
// fetched, and not one of l's refs until it is stored (store.Settle). Its
// bytes count against the fetch's limits as if fetched.
func (f *fetcher) owes(l record.Address, e store.Entry) (bool, error) {
	o, ok := f.owe[e.Address]
	if !ok {
		return false, nil
	}
	if o.Size != e.Size {
		return false, fmt.Errorf("%w: slab %s listed as %d bytes and as %d", ErrMalformed, e.Address, o.Size, e.Size)
	}
	if !slices.Contains(f.out.owing.Listings, l) {
		f.out.owing.Listings = append(f.out.owing.Listings, l)
	}
	if slices.Contains(f.out.owing.Slabs, e.Address) {
		return true, nil
	}
	if err := f.book(e.Address, int64(e.Size)); err != nil {
		return false, err
	}
	f.out.owing.Slabs = append(f.out.owing.Slabs, e.Address)
	return true, nil
}

// owedChunks gives each owed slab its chunks, from the verified index of
// the file it is a slab of (staged by now, or held).
func (f *fetcher) owedChunks(rec *record.Record) error {
	if len(f.out.owing.Slabs) == 0 {
		return nil
	}
	mem, _ := lastMemory(rec)
	es, err := store.DecodeListing(f.pre[mem])
	if err != nil {
		return fmt.Errorf("transfer: listing %s: %w: %w", mem, ErrMalformed, err)
	}
	cfs, err := store.ChunkedFiles(es, func(e store.Entry) ([]byte, error) {
		r, err := f.out.Open(e.Address)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return io.ReadAll(r) // staged within the object limit; io.EOF only once verified
	})
	if err != nil {
		return fmt.Errorf("transfer: listing %s: %w: %w", mem, ErrMalformed, err)
	}
	f.out.owed = OwedSlabs(cfs, f.out.owing.Slabs)
	if len(f.out.owed) != len(f.out.owing.Slabs) {
		// A slab-form name outside a slab form's rules: ChunkedFiles
		// refuses those; here for safety.
		return fmt.Errorf("transfer: listing %s: %w: %d slabs owed, %d in a slab form", mem, ErrMalformed, len(f.out.owing.Slabs), len(f.out.owed))
	}
	return nil
}

// OwedSlabs are the slabs of owed among the slab forms of cfs (a memory
// listing's chunked files, store.ChunkedFiles), each once, with the
// chunks its index gives it.
func OwedSlabs(cfs []store.ChunkedFile, owed []record.Address) []OwedSlab {
	var out []OwedSlab
	at := map[record.Address]int{}
	for _, cf := range cfs {
		for i, sl := range cf.Slabs {
			if !slices.Contains(owed, sl.Address) {
				continue
			}
			k, ok := at[sl.Address]
			if !ok {
				k = len(out)
				at[sl.Address] = k
				out = append(out, OwedSlab{Slab: sl})
			}
			for _, ch := range cf.Chunks {
				if ch.In.Name == sl.Name {
					out[k].Chunks = append(out[k].Chunks, store.SlabChunk{Vaddr: ch.Vaddr, Size: ch.Size, Slab: i, Offset: ch.Offset, Address: ch.Address})
				}
			}
		}
	}
	return out
}
