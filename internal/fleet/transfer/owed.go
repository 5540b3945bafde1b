package transfer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Owed is a slab the store lacks that a post-copy migration brings in
// behind a lazily restored unit (docs/notes/post-copy-design.md): one
// chunk at a time from the source, the chunk a fault waits for first
// ([Owed.Chunk]) and the rest in the background ([Owed.Fill]). Each chunk
// is verified against its address in the verified index before it is
// written into a sparse file in staging; the bytes of the slab no chunk
// of the index covers (a later park's slab may hold chunks of another
// park) are read in ranges verified only by the whole. Once every byte is
// in, the whole file must hash to the slab's address, and only then is it
// adopted ([Owed.Adopt]). The first refusal is final: a source that sent
// one wrong byte is not asked again.
type Owed struct {
	from Source
	slab store.Entry
	// chunks are the index's chunks in this slab, by offset, each range
	// once.
	chunks []store.SlabChunk
	dir    string
	f      *os.File

	mu   sync.Mutex
	have []bool          // per chunk: written
	busy []chan struct{} // per chunk: a fetch under way, closed as it ends
	held int             // chunks written
	err  error           // the first refusal
}

// ErrOwed: an owed slab whose chunks do not fit it: a chunk past its
// listed size, or two chunks of it that overlap.
var ErrOwed = errors.New("transfer: the index's chunks do not fit the owed slab")

// NewOwed makes slab (its listed name, size and address) owed to st, to
// be brought from from: chunks are the records of the verified index
// (store.DecodeSlabIndex) that name it, by slab number. Close it.
func NewOwed(st *store.Store, from Source, slab store.Entry, chunks []store.SlabChunk) (*Owed, error) {
	cs := slices.Clone(chunks)
	slices.SortFunc(cs, func(a, b store.SlabChunk) int { return cmp.Compare(a.Offset, b.Offset) })
	cs = slices.CompactFunc(cs, func(a, b store.SlabChunk) bool {
		return a.Offset == b.Offset && a.Size == b.Size && a.Address == b.Address
	})
	var end uint64
	for _, c := range cs {
		if c.Offset < end || c.Size == 0 || c.Size > MaxRange || c.Offset > slab.Size || c.Size > slab.Size-c.Offset {
			return nil, fmt.Errorf("%w: %q: a chunk of %d bytes at %d (%d bytes listed)", ErrOwed, slab.Name, c.Size, c.Offset, slab.Size)
		}
		end = c.Offset + c.Size
	}
	dir, err := st.StagingDir("owed")
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "slab"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = f.Truncate(int64(slab.Size))
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		os.RemoveAll(dir)
		return nil, fmt.Errorf("transfer: %w", err)
	}
	return &Owed{from: from, slab: slab, chunks: cs, dir: dir, f: f, have: make([]bool, len(cs)), busy: make([]chan struct{}, len(cs))}, nil
}

// Path is the file the slab is filled in: a chunk [Owed.Chunk] returned
// nil for is at its offset there.
func (o *Owed) Path() string { return o.f.Name() }

// Find is the chunk of the slab at off, of size bytes; ok is false when
// the index lists none there.
func (o *Owed) Find(off, size uint64) (i int, ok bool) {
	i, ok = slices.BinarySearchFunc(o.chunks, off, func(c store.SlabChunk, off uint64) int { return cmp.Compare(c.Offset, off) })
	return i, ok && o.chunks[i].Size == size
}

// Chunk makes sure chunk i ([Owed.Find]) is written, fetching it unless it is, or
// another call is fetching it (then it waits for that one), and returns
// nil once it is, or the refusal. A call whose ctx ends gives up alone:
// the chunk may be asked again.
func (o *Owed) Chunk(ctx context.Context, i int) error {
	if i < 0 || i >= len(o.chunks) {
		return fmt.Errorf("%w: %q has no chunk %d", ErrOwed, o.slab.Name, i)
	}
	for {
		o.mu.Lock()
		if err := o.err; err != nil {
			o.mu.Unlock()
			return err
		}
		if o.have[i] {
			o.mu.Unlock()
			return nil
		}
		if ch := o.busy[i]; ch != nil {
			o.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		ch := make(chan struct{})
		o.busy[i] = ch
		o.mu.Unlock()
		c := o.chunks[i]
		b, err := ReadRange(ctx, o.from, Range{Object: o.slab.Address, Offset: c.Offset, Size: c.Size, Sum: c.Address})
		if err == nil {
			_, err = o.f.WriteAt(b, int64(c.Offset))
		}
		o.mu.Lock()
		o.busy[i] = nil
		close(ch)
		switch {
		case err == nil:
			o.have[i] = true
			o.held++
		case ctx.Err() != nil:
		case o.err == nil:
			o.err = err
		}
		o.mu.Unlock()
		return err
	}
}

// Held is how many of the slab's chunks are written, of how many.
func (o *Owed) Held() (held, of int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held, len(o.chunks)
}

// Fill brings in every chunk not written yet, in offset order, then the
// bytes no chunk covers, and checks the whole hashes to the slab's
// address.
func (o *Owed) Fill(ctx context.Context) error {
	for i := range o.chunks {
		if err := o.Chunk(ctx, i); err != nil {
			return err
		}
	}
	var at uint64
	for _, c := range append(slices.Clone(o.chunks), store.SlabChunk{Offset: o.slab.Size}) {
		for at < c.Offset {
			n := min(c.Offset-at, MaxRange)
			if err := o.gap(ctx, at, n); err != nil {
				return o.fail(err)
			}
			at += n
		}
		at = c.Offset + c.Size
	}
	h := blake3.New(32, nil)
	if _, err := io.Copy(h, io.NewSectionReader(o.f, 0, int64(o.slab.Size))); err != nil {
		return o.fail(fmt.Errorf("transfer: %w", err))
	}
	var got record.Address
	h.Sum(got[:0])
	if got != o.slab.Address {
		return o.fail(fmt.Errorf("transfer: owed slab %q: %w: %w", o.slab.Name, ErrMismatch, &store.CorruptError{Address: o.slab.Address, Got: got, Path: o.f.Name()}))
	}
	return nil
}

// gap reads n bytes at off that no chunk covers: verified by the whole.
func (o *Owed) gap(ctx context.Context, off, n uint64) error {
	b, err := readRange(ctx, o.from, Range{Object: o.slab.Address, Offset: off, Size: n}, false)
	if err == nil {
		_, err = o.f.WriteAt(b, int64(off))
	}
	return err
}

func (o *Owed) fail(err error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil {
		o.err = err
	}
	return o.err
}

// Adopt makes the filled slab an object of st once [Owed.Fill] returned
// nil: synced, then adopted at the address it was checked to hash to.
func (o *Owed) Adopt(ctx context.Context, st *store.Store) error {
	o.mu.Lock()
	err := o.err
	o.mu.Unlock()
	if err != nil {
		return err
	}
	if err := o.f.Sync(); err != nil {
		return fmt.Errorf("transfer: %w", err)
	}
	a, err := st.Adopt(ctx, o.f.Name())
	if err != nil {
		return err
	}
	if a != o.slab.Address {
		// Written after Fill checked it: not this package's doing.
		return fmt.Errorf("transfer: owed slab %q adopted as %s, listed as %s", o.slab.Name, a, o.slab.Address)
	}
	return nil
}

// Close lets the owed slab go: what was not adopted is removed.
func (o *Owed) Close() error {
	o.f.Close()
	return os.RemoveAll(o.dir)
}
