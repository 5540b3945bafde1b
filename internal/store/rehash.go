package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/runrecordd/runrecordd/internal/treehash"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Rehash returns the address that the bytes stored for object a hash to
// now: a itself while they are intact, another address once any byte
// changed. Unlike [Store.Verify] it does not fail because the bytes
// changed: it answers what the bytes on disk offer, for a caller that
// compares that with what a record names and reports a difference its own
// way (a resume's first precondition). A missing object is an error
// wrapping [ErrMissingObject].
//
// A file is hashed as the two subtrees under the BLAKE3 root, on two
// goroutines (internal/treehash): a memory image is one large file, and a
// resume waits for its hash.
func (s *Store) Rehash(ctx context.Context, a record.Address) (record.Address, error) {
	f, err := os.Open(s.Path(a))
	if err != nil {
		return record.Address{}, notFound(a, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return record.Address{}, fmt.Errorf("object %s: %w", a, err)
	}
	if info.Size() <= smallObject {
		bp := smallBufs.Get().(*[]byte)
		defer smallBufs.Put(bp)
		n, err := io.ReadFull(f, *bp)
		switch {
		case err == nil:
			// It grew past smallObject since the Stat: hashed below
			// as a larger object is, up to the size the Stat gave.
		case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
			return record.Sum((*bp)[:n]), nil
		default:
			return record.Address{}, fmt.Errorf("object %s: %w", a, err)
		}
	}
	got, err := treehash.Halves(ctx, f, info.Size())
	if err != nil {
		return record.Address{}, fmt.Errorf("object %s: %w", a, err)
	}
	return got, nil
}

// smallObject is the largest object [Store.Rehash] reads in one buffer
// and hashes on the caller's goroutine: a store chunk (16 KiB) and a CRIU
// image's small files. Halves' two goroutines and 1 MiB buffers, each
// zeroed again after a collection empties their pool, cost a served
// resume more than the hashing of its 27 small files (36 KiB) did.
const smallObject = 64 << 10

// smallBufs holds Rehash's buffers, one byte over smallObject to see
// an object that grew.
var smallBufs = sync.Pool{New: func() any { b := make([]byte, smallObject+1); return &b }}

// RehashDir is [Store.Rehash] for a directory object: it returns the
// address of the listing that dir's stored bytes offer now, dir itself
// while the listing and every file it names are intact. If the listing's
// own bytes changed, the address they hash to is returned (they need not
// decode). Otherwise every file is rehashed, one worker per processor as
// [Store.Ingest] hashes, and the listing is rebuilt with each file's
// address as its bytes hash now (names, modes and sizes as listed): one
// changed byte in any file gives a different address. A missing listing
// or file is an error wrapping [ErrMissingObject], naming the file.
func (s *Store) RehashDir(ctx context.Context, dir record.Address) (record.Address, error) {
	es, got, err := s.RehashListing(ctx, dir)
	if err != nil || got != dir {
		return got, err
	}
	all := make([]int, len(es))
	for i := range all {
		all[i] = i
	}
	changed, err := s.RehashEntries(ctx, dir, es, all)
	if err != nil {
		return record.Address{}, err
	}
	if !changed {
		return dir, nil
	}
	return ListingAddress(es)
}

// RehashListing rehashes directory object dir's listing alone: it returns
// its entries and dir while the listing is intact, or no entries and the
// address its bytes hash to now (they need not decode). The bytes are
// read once, and the ones hashed are the ones decoded.
func (s *Store) RehashListing(ctx context.Context, dir record.Address) ([]Entry, record.Address, error) {
	b, _, err := s.readWhole(dir, MaxListingBytes)
	if errors.Is(err, errTooLarge) {
		// No listing: what its bytes hash to, streamed.
		got, err := s.Rehash(ctx, dir)
		if err != nil || got != dir {
			return nil, got, err
		}
		return nil, record.Address{}, fmt.Errorf("directory %s: %w: %w: over %d bytes", dir, ErrCorrupt, ErrListing, MaxListingBytes)
	}
	if err != nil {
		return nil, record.Address{}, err
	}
	if got := record.Sum(b); got != dir {
		return nil, got, nil
	}
	es, err := DecodeListing(b)
	if err != nil {
		return nil, record.Address{}, fmt.Errorf("directory %s: %w", dir, err)
	}
	return es, dir, nil
}

// RehashEntries rehashes the files es[i] (entries of directory dir's
// listing) for each i in pick, one worker per processor, and sets each
// one's Address to what its bytes hash to now; changed says whether any
// differed. A missing file is an error wrapping [ErrMissingObject],
// naming it.
func (s *Store) RehashEntries(ctx context.Context, dir record.Address, es []Entry, pick []int) (changed bool, _ error) {
	sums := make([]record.Address, len(pick))
	err := parallel(ctx, len(pick), func(i int) (err error) {
		e := es[pick[i]]
		sums[i], err = s.Rehash(ctx, e.Address)
		if err != nil {
			return fmt.Errorf("directory %s, file %s: %w", dir, e.Name, err)
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	for i, j := range pick {
		if sums[i] != es[j].Address {
			es[j].Address, changed = sums[i], true
		}
	}
	return changed, nil
}

// ListingAddress is the address of the listing of es.
func ListingAddress(es []Entry) (record.Address, error) {
	b, err := EncodeListing(es)
	if err != nil {
		return record.Address{}, fmt.Errorf("store: %w", err)
	}
	return record.Sum(b), nil
}

// LinkRehashed lays files out as [LinkFiles] does, as hard links to the
// stored objects, but without hashing them again: only for a directory
// object that [Store.RehashDir] has just found intact (it returned the
// directory's own address), so that a resume reads each byte once. The
// listing itself is still read verified.
const LinkRehashed Layout = CopyFiles + 1
