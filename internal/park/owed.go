package park

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Owed is what a lazy resume knows of the slabs a post-copy migration
// still owes the store (docs/fleet.md, "Post-copy"; internal/fleet/member):
// each is filled in a file of its own while the unit runs, each chunk
// verified against its record in the memory image's verified index
// before it is written there.
type Owed interface {
	// Path is the file slab is filled in, if slab is owed.
	Path(slab record.Address) (string, bool)
	// Fetch returns nil once the chunk of slab at offset, of size bytes,
	// is in slab's file, verified; or why it is not.
	Fetch(ctx context.Context, slab record.Address, offset, size uint64) error
	// Bytes is the size of the owed slabs together.
	Bytes() uint64
}

// owedPath is the file chunk ch is filled in, if its slab is owed.
func owedPath(ch store.Chunk, owed Owed) (string, bool) {
	if owed == nil || ch.In.Address == ch.Address {
		return "", false // a chunk of its own is never owed
	}
	return owed.Path(ch.In.Address)
}

// chunkFiles are where a snapshot's chunks are: in the store, or, a slab
// owed (owed: nil, none is), in the file it is filled in.
type chunkFiles struct {
	st   *store.Store
	owed Owed
}

// path is the file holding chunk ch: its slab's object, or the file its
// owed slab is filled in.
func (c chunkFiles) path(ch store.Chunk) string {
	if p, ok := owedPath(ch, c.owed); ok {
		return p
	}
	return c.st.Path(ch.In.Address)
}

// sumChunk is the hash of chunk ch's bytes in its slab: in the store, or,
// fetched first, in the file its owed slab is filled in.
func sumChunk(ctx context.Context, st *store.Store, ch store.Chunk, owed Owed) (record.Address, error) {
	if _, ok := owedPath(ch, owed); !ok {
		return st.SumRange(ch.In.Address, ch.Offset, ch.Size)
	}
	if err := owed.Fetch(ctx, ch.In.Address, ch.Offset, ch.Size); err != nil {
		return record.Address{}, fmt.Errorf("chunk %q of owed slab %s: %w", ch.Name, ch.In.Address, err)
	}
	b, err := readChunk(chunkFiles{st, owed}, ch)
	if err != nil {
		return record.Address{}, err
	}
	return record.Sum(b), nil
}
