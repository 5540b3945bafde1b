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
// adopted ([Owed.Adopt]). A refusal of the source's bytes ([ErrMismatch])
// is final: a source that sent one wrong byte is not asked again. Any
// other failure (the link, a timeout) fails only the read it ended.
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
	err  error           // the first refusal of the source's bytes
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
	if err == nil {
		// Its second name, which the adoption does not move (Path).
		err = os.Link(f.Name(), filepath.Join(dir, servedName))
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

// Size is the slab's size.
func (o *Owed) Size() uint64 { return o.slab.Size }

// servedName is the slab's file's second name in its staging directory.
const servedName = "served"

// Path is the file the slab is filled in: a chunk [Owed.Chunk] returned
// nil for is at its offset there. It names the same file after
// [Owed.Adopt] (then the store's object), until [Owed.Close]: a page
// server serving a lazy restore from it reads on.
func (o *Owed) Path() string { return filepath.Join(o.dir, servedName) }

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
		if o.have[i] { // verified when written, whatever came after
			o.mu.Unlock()
			return nil
		}
		if err := o.err; err != nil {
			o.mu.Unlock()
			return err
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
		return o.read(ctx, []int{i}, []chan struct{}{ch})
	}
}

// ChunkAhead is [Owed.Chunk], reading with chunk i, in the same ranged
// read, the chunks after it that lie back to back and are neither written
// nor being fetched, up to MaxRange bytes: a lazy restore's page server
// asks for the chunks that follow a fault next.
func (o *Owed) ChunkAhead(ctx context.Context, i int) error {
	if i < 0 || i >= len(o.chunks) {
		return fmt.Errorf("%w: %q has no chunk %d", ErrOwed, o.slab.Name, i)
	}
	_, err := o.run(ctx, i)
	return err
}

// ended records the end of the fetch of chunks is (busy as chs): written
// unless err, which, a refusal of the source's bytes, is final.
func (o *Owed) ended(is []int, chs []chan struct{}, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, i := range is {
		o.busy[i] = nil
		close(chs[k])
		if err == nil {
			o.have[i] = true
			o.held++
		}
	}
	if err != nil && errors.Is(err, ErrMismatch) && o.err == nil {
		o.err = err
	}
}

// run fetches, in one ranged read of at most MaxRange bytes, the chunks
// from i on that lie back to back and are neither written nor being
// fetched, each verified against its index record before any is written;
// it returns the index after the last it took (i+1 at least, when chunk i
// itself was taken by another fetch meanwhile).
func (o *Owed) run(ctx context.Context, i int) (int, error) {
	o.mu.Lock()
	if o.have[i] {
		o.mu.Unlock()
		return i + 1, nil
	}
	if o.err != nil {
		o.mu.Unlock()
		return i, o.err
	}
	var is []int
	var chs []chan struct{}
	for j := i; j < len(o.chunks) && !o.have[j] && o.busy[j] == nil; j++ {
		if len(is) > 0 {
			prev := o.chunks[j-1]
			if o.chunks[j].Offset != prev.Offset+prev.Size || o.chunks[j].Offset+o.chunks[j].Size-o.chunks[i].Offset > MaxRange {
				break
			}
		}
		ch := make(chan struct{})
		o.busy[j] = ch
		is, chs = append(is, j), append(chs, ch)
	}
	o.mu.Unlock()
	if len(is) == 0 {
		return i + 1, o.Chunk(ctx, i) // written, or another fetch's: wait for it
	}
	return is[len(is)-1] + 1, o.read(ctx, is, chs)
}

// read fetches chunks is, back to back and marked busy as chs, in one
// ranged read, checks each against its index record, writes them unless
// one is refused, and records the end (ended).
func (o *Owed) read(ctx context.Context, is []int, chs []chan struct{}) error {
	first, last := o.chunks[is[0]], o.chunks[is[len(is)-1]]
	b, err := readRange(ctx, o.from, Range{Object: o.slab.Address, Offset: first.Offset, Size: last.Offset + last.Size - first.Offset}, false)
	for k := 0; err == nil && k < len(is); k++ {
		c := o.chunks[is[k]]
		err = checkChunk(o.slab.Address, c.Offset, b[c.Offset-first.Offset:c.Offset-first.Offset+c.Size], c.Address)
	}
	if err == nil {
		_, err = o.f.WriteAt(b, int64(first.Offset))
	}
	o.ended(is, chs, err)
	return err
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
	for i := 0; i < len(o.chunks); {
		next, err := o.run(ctx, i)
		if err != nil {
			return err
		}
		i = next
	}
	var at uint64
	for _, c := range append(slices.Clone(o.chunks), store.SlabChunk{Offset: o.slab.Size}) {
		for at < c.Offset {
			n := min(c.Offset-at, MaxRange)
			if err := o.gap(ctx, at, n); err != nil {
				return err // unverified bytes: only the whole can refuse them
			}
			at += n
		}
		at = c.Offset + c.Size
	}
	h := blake3.New(32, nil)
	if _, err := io.Copy(h, io.NewSectionReader(o.f, 0, int64(o.slab.Size))); err != nil {
		return fmt.Errorf("transfer: %w", err)
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

// Err is the refusal of the source's bytes that ended the slab's filling
// ([ErrMismatch]), or nil: its written chunks are still served.
func (o *Owed) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
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
