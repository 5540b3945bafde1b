package park

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// kinShare: a kin's slab is listed in a park only where the park's
// chunks in it are at least 1/kinShare of its bytes (slabber.keepSlabs).
const kinShare = 4

// ChunkSize is the chunk of an image park's pages files in the chunked
// form: cut where the virtual address crosses a multiple of it and where
// a run of present pages ends (vaddr-16k, docs/chunked-images.md).
const ChunkSize = 16 << 10

// MinChunked is the smallest pages file stored in chunks; smaller ones,
// and every other file of the image, stay whole.
const MinChunked = 1 << 20

// ChunkStats is what the chunking of a park's pages files found.
type ChunkStats struct {
	Files  int // pages files stored in chunks
	Chunks int // their chunks
	Held   int // chunks the base park's slabs held already (not written again)
	Early  int // chunks hashed while CRIU wrote (early.go)
	// Unchanged counts the chunks found the same, byte for byte, as a
	// made base's chunk at their virtual address: not hashed unless they
	// are written again.
	Unchanged int
	New       int64 // bytes of the chunks it did not hold
}

// planChunks prepares the slab form (store.ChunkedFiles, docs/store.md
// "Slabs") of each pages file of the staged image directory: it takes
// the hashes early made (the follower's; [slabber.vouched] drops them if
// it does not vouch for the file) of chunks at the same offset and size,
// hashes the others, and finds those
// whose bytes the base park's slabs hold (compared: an imported index is
// hostile, its addresses not trusted); [slabber.put] then stages the
// form. An early hash is listed only where the final bytes are checked
// against it or relied on as the follower's (early.go): a chunk written
// into a new slab is hashed again from them; the pages file stored whole
// as slab 00 is stored under the follower's hash of it, or hashed again
// in chunks if there is none (a later park's follower hashes none).
// A pages file under [MinChunked], one whose size its pagemap does not
// give, one whose runs do not go up in address, one of more than
// store.MaxChunks chunks, or one past store.MaxListedChunks of the
// image's chunked files together stays whole. held is heldChunks of the
// base, the memory image of the park before (nil: none).
func planChunks(ctx context.Context, st *store.Store, images string, base based, early func(name string) map[uint64]earlyChunk) ([]*slabber, error) {
	pms, err := readPagemaps(images)
	if err != nil {
		return nil, fmt.Errorf("park: chunking: %w", err)
	}
	var plans []*slabber
	done := map[string]bool{}
	total := 0 // chunks planned, at most store.MaxListedChunks
	for _, pm := range pms {
		info, err := os.Stat(filepath.Join(images, pm.pages))
		if err != nil || done[pm.pages] || info.Size() < MinChunked || uint64(info.Size()) != pm.bytes || !pm.increasing() {
			continue
		}
		n := len(pm.spans(ChunkSize))
		if n > store.MaxChunks || total+n > store.MaxListedChunks {
			continue
		}
		total += n
		done[pm.pages] = true
		c := &slabber{st: st, dir: images, name: pm.pages, mode: info.Mode().Perm(), base: base.held, at: base.at[pm.pages], kin: base.kin, early: early(pm.pages)}
		if err := c.plan(ctx, pm); err != nil {
			return nil, fmt.Errorf("park: chunking %s: %w", pm.pages, err)
		}
		plans = append(plans, c)
	}
	return plans, nil
}

// putChunks stages the slab form of each planned file: its new slab (the
// pages file itself, renamed, when the base held none of its chunks) and
// its index, with their addresses added to known (which must not be
// nil). It returns the entries of the base slabs to list without a staged
// copy ([store.Store.IngestChunks]).
func putChunks(plans []*slabber, known map[string]store.Hashed) ([]store.Entry, ChunkStats, error) {
	var cs ChunkStats
	var stored []store.Entry
	for _, c := range plans {
		if err := c.put(known); err != nil {
			return nil, cs, fmt.Errorf("park: chunking %s: %w", c.name, err)
		}
		stored = append(stored, c.stored...)
		cs.Files++
		cs.Chunks += len(c.ps)
		cs.Held += c.held
		cs.Early += int(c.fromEarly.Load())
		cs.Unchanged += int(c.unchanged.Load())
		cs.New += c.new
	}
	return stored, cs, nil
}

// heldAt is where a base park's slab holds a chunk's bytes; made is
// whether this process wrote the listing that says so (made).
type heldAt struct {
	slab   store.Entry
	offset uint64
	made   bool
}

// heldChunks maps each chunk address of base's slab-form files to where
// a slab holds it, and, when made (this process wrote base's listing),
// each file's virtual addresses to the chunks there.
// Chunks of the one-file-per-chunk form are not used.
func heldChunks(base []store.ChunkedFile, made bool) based {
	b := based{held: map[record.Address]heldAt{}}
	if made {
		b.at = map[string]map[uint64]chunkAt{}
	}
	for _, cf := range base {
		if cf.Index == nil {
			continue
		}
		var at map[uint64]chunkAt
		if made {
			at = make(map[uint64]chunkAt, len(cf.Chunks))
			b.at[cf.Name] = at
		}
		for _, ch := range cf.Chunks {
			h := heldAt{ch.In, ch.Offset, made}
			if _, ok := b.held[ch.Address]; !ok {
				b.held[ch.Address] = h
			}
			if at != nil {
				at[ch.Vaddr] = chunkAt{h, ch.Address, ch.Size}
			}
		}
	}
	return b
}

// based is where a base park's slabs hold chunks: by address, and, when
// this process wrote its listing (made), by file and virtual address.
type based struct {
	held map[record.Address]heldAt
	at   map[string]map[uint64]chunkAt // nil unless made
	// kin is whether the base is a kin's park, not the run's own: its
	// slabs are listed only where they hold enough of the park's bytes
	// (slabber.keepSlabs).
	kin bool
}

// chunkAt is the chunk a made base's file holds at a virtual address:
// a piece of the same address and size whose bytes are the same as
// those its slab holds has its address, unhashed.
type chunkAt struct {
	heldAt
	addr record.Address
	size uint64
}

// slabber puts one staged pages file into the slab form.
type slabber struct {
	st     *store.Store
	dir    string
	name   string
	mode   os.FileMode
	base   map[record.Address]heldAt
	at     map[uint64]chunkAt    // by virtual address: a made base's (heldChunks)
	kin    bool                  // the base is a kin's (based.kin)
	early  map[uint64]earlyChunk // by offset: chunks the follower hashed (early.go)
	pm     pagemap               // the file's
	ps     []piece               // planned
	size   uint64                // the pages file's
	stored []store.Entry
	held   int
	new    int64
	// fromEarly counts the pieces whose hash the follower made;
	// unchanged, those found the same as a made base's chunk at their
	// virtual address, unhashed.
	fromEarly, unchanged atomic.Int64
	index                record.Address // the index put staged
}

// piece is one chunk of the staged pages file being put in slabs.
type piece struct {
	vaddr, size, at uint64 // at: its offset in the staged file
	addr            record.Address
	in              *heldAt // the base slab holding the same bytes, if any
	early           bool    // addr is the follower's (early.go)
	unhashed        bool    // addr is a made base's chunk's, found the same by its bytes
}

// plan hashes the chunks of the pages file that pm names.
func (c *slabber) plan(ctx context.Context, pm pagemap) error {
	c.pm = pm
	f, err := os.Open(filepath.Join(c.dir, c.name))
	if err != nil {
		return err
	}
	defer f.Close()
	spans := pm.spans(ChunkSize)
	c.ps = make([]piece, len(spans))
	for i, sp := range spans {
		c.ps[i] = piece{vaddr: sp.vaddr, size: sp.bytes, at: c.size}
		c.size += sp.bytes
	}
	return c.hash(ctx, f, c.ps)
}

// vouched plans the file again without early hashes if it took some and
// the follower does not vouch for them (early, what it vouches for, is
// nil): the file changed after the follower read it.
func (c *slabber) vouched(ctx context.Context, early map[uint64]earlyChunk) error {
	if early != nil || c.fromEarly.Load() == 0 {
		return nil
	}
	c.early, c.size = nil, 0
	c.fromEarly.Store(0)
	c.unchanged.Store(0)
	return c.plan(ctx, c.pm)
}

// put stages the planned slab form, adding what it hashed to known.
func (c *slabber) put(known map[string]store.Hashed) error {
	p := filepath.Join(c.dir, c.name)
	ps := c.ps
	slabs, kept := c.keepSlabs(ps)
	if err := os.Mkdir(p+store.SlabSuffix, 0o700); err != nil {
		return err
	}
	index := make([]store.SlabChunk, len(ps))
	var fresh []int // the pieces the new slab holds
	for i, pc := range ps {
		index[i] = store.SlabChunk{Vaddr: pc.vaddr, Size: pc.size, Address: pc.addr}
		if pc.in != nil {
			index[i].Slab, index[i].Offset = slabs[pc.in.slab.Address], pc.in.offset
			c.held++
			continue
		}
		fresh = append(fresh, i)
	}
	for i, e := range kept {
		c.stored = append(c.stored, store.Entry{Name: store.SlabName(c.name, i), Mode: e.Mode, Size: e.Size, Address: e.Address})
	}
	switch {
	case len(fresh) == len(ps):
		// Nothing held: the pages file is the slab, renamed, under the
		// follower's hash of it if any, else its early hashes checked.
		k, vouched := known[c.name]
		if !vouched {
			if err := c.rehashEarly(ps); err != nil {
				return err
			}
		}
		if err := os.Rename(p, filepath.Join(c.dir, store.SlabName(c.name, 0))); err != nil {
			return err
		}
		if vouched {
			known[store.SlabName(c.name, 0)] = k
		}
		for i := range index {
			index[i].Offset, index[i].Address = ps[i].at, ps[i].addr
		}
		c.new = int64(c.size)
	case len(fresh) > 0:
		// The fresh pieces are read first if they fit freshInMemory, so
		// that the staged file's removal (dropping its pages) goes on
		// beside the slab's write.
		src, err := c.readFresh(ps, fresh)
		if err != nil {
			return err
		}
		removed := make(chan error, 1)
		if src != nil {
			go func() { removed <- os.Remove(p) }()
		}
		h, err := c.writeSlab(ps, fresh, index, len(kept), src)
		if src != nil {
			err = errors.Join(err, <-removed)
		} else if err == nil {
			err = os.Remove(p)
		}
		if err != nil {
			return err
		}
		known[store.SlabName(c.name, len(kept))] = h
		c.new = h.Size
	default:
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	delete(known, c.name)
	b := store.EncodeSlabIndex(index)
	if err := writeMode(filepath.Join(c.dir, store.SlabIndexName(c.name)), b, c.mode); err != nil {
		return err
	}
	c.index = record.Sum(b)
	known[store.SlabIndexName(c.name)] = store.Hashed{Size: int64(len(b)), Address: c.index}
	return nil
}

// hash hashes every piece of the staged pages file that the follower did
// not (mapped, so that no byte is copied), one worker per processor, and
// finds the base slab holding each piece's bytes: the address in a base
// index, and, unless this process wrote the base's listing, the bytes
// there compared with the piece's (an imported index is hostile: its
// addresses are not trusted, nor the slabs a listing pairs with an index
// this process wrote).
// A base slab that is not a regular file of its listed size is not used.
func (c *slabber) hash(ctx context.Context, f *os.File, ps []piece) error {
	staged, err := mapFile(f, c.size)
	if err != nil {
		return err
	}
	defer unix.Munmap(staged)
	slabs := map[record.Address][]byte{}
	defer func() {
		for _, m := range slabs {
			unix.Munmap(m)
		}
	}()
	// The slabs whose bytes are compared: a made base's this file has
	// chunks in (at), or any other base's.
	compared := map[record.Address]store.Entry{}
	if c.at != nil {
		for _, h := range c.at {
			compared[h.slab.Address] = h.slab
		}
	} else {
		for _, h := range c.base {
			if !h.made {
				compared[h.slab.Address] = h.slab
			}
		}
	}
	for a, slab := range compared {
		slabs[a] = nil
		sf, err := os.Open(c.st.Path(a))
		if err != nil {
			continue // not held after all: stored anew
		}
		m, err := mapFile(sf, slab.Size)
		sf.Close()
		if err == nil {
			slabs[a] = m
		}
	}
	workers := min(runtime.GOMAXPROCS(0), max(1, len(ps)/64))
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w * len(ps) / workers; i < (w+1)*len(ps)/workers; i++ {
				if i%256 == 0 && ctx.Err() != nil {
					errs[w] = ctx.Err()
					return
				}
				pc := &ps[i]
				b := staged[pc.at : pc.at+pc.size]
				if e, ok := c.early[pc.at]; ok && e.size == pc.size {
					pc.addr, pc.early = e.addr, true
					c.fromEarly.Add(1)
				} else if h, ok := c.at[pc.vaddr]; ok && h.size == pc.size && sameAs(slabs[h.slab.Address], h.offset, b) {
					pc.addr, pc.in, pc.unhashed = h.addr, &h.heldAt, true
					c.unchanged.Add(1)
					continue
				} else {
					pc.addr = record.Sum(b)
				}
				h, ok := c.base[pc.addr]
				switch {
				case !ok:
					continue
				case h.made:
					pc.in = &h
					continue
				}
				if sameAs(slabs[h.slab.Address], h.offset, b) {
					pc.in = &h
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sameAs is whether the slab mapped as m holds b at offset.
func sameAs(m []byte, offset uint64, b []byte) bool {
	return offset <= uint64(len(m)) && uint64(len(b)) <= uint64(len(m))-offset && bytes.Equal(m[offset:offset+uint64(len(b))], b)
}

// rehashEarly hashes again, from the staged file's final bytes, the
// pieces of ps whose hash the follower made, one worker per processor.
func (c *slabber) rehashEarly(ps []piece) error {
	f, err := os.Open(filepath.Join(c.dir, c.name))
	if err != nil {
		return err
	}
	defer f.Close()
	staged, err := mapFile(f, c.size)
	if err != nil {
		return err
	}
	defer unix.Munmap(staged)
	workers := min(runtime.GOMAXPROCS(0), max(1, len(ps)/64))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w * len(ps) / workers; i < (w+1)*len(ps)/workers; i++ {
				if pc := &ps[i]; pc.early || pc.unhashed {
					pc.addr, pc.early, pc.unhashed = record.Sum(staged[pc.at:pc.at+pc.size]), false, false
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// mapFile maps f, which must be a regular file of size bytes, read-only.
func mapFile(f *os.File, size uint64) ([]byte, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() || uint64(info.Size()) != size || size == 0 || size > 1<<40 {
		return nil, fmt.Errorf("%s: %d bytes, want %d", f.Name(), info.Size(), size)
	}
	return unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
}

// keepSlabs numbers the base slabs the pieces are held in, at most
// store.MaxSlabs-1 of them (the new slab is the last): those holding the
// most bytes, and of a kin's only those whose bytes the pieces are at
// least 1/kinShare of; the pieces of the others are stored anew. It returns their
// numbers and, in that order, their entries.
func (c *slabber) keepSlabs(ps []piece) (map[record.Address]int, []store.Entry) {
	// A slab's bytes the pieces use, each range once: many pieces may
	// hold the same bytes (zero pages) at one place.
	bytesIn := map[record.Address]uint64{}
	entries := map[record.Address]store.Entry{}
	type place struct {
		slab   record.Address
		offset uint64
	}
	used := map[place]bool{}
	for _, pc := range ps {
		if pc.in != nil {
			if at := (place{pc.in.slab.Address, pc.in.offset}); !used[at] {
				used[at] = true
				bytesIn[pc.in.slab.Address] += pc.size
			}
			entries[pc.in.slab.Address] = pc.in.slab
		}
	}
	order := make([]record.Address, 0, len(bytesIn))
	drop := map[record.Address]bool{}
	for a := range bytesIn {
		// A kin's slab holding little of this park would be carried
		// and counted whole for it.
		if c.kin && bytesIn[a]*kinShare < uint64(entries[a].Size) {
			drop[a] = true
			continue
		}
		order = append(order, a)
	}
	slices.SortFunc(order, func(x, y record.Address) int {
		if bytesIn[x] != bytesIn[y] {
			return cmp.Compare(bytesIn[y], bytesIn[x])
		}
		return bytes.Compare(x[:], y[:])
	})
	if len(order) > store.MaxSlabs-1 {
		for _, a := range order[store.MaxSlabs-1:] {
			drop[a] = true
		}
		order = order[:store.MaxSlabs-1]
	}
	for i := range ps {
		if ps[i].in != nil && drop[ps[i].in.slab.Address] {
			ps[i].in = nil
		}
	}
	slabs := make(map[record.Address]int, len(order))
	kept := make([]store.Entry, len(order))
	for i, a := range order {
		slabs[a], kept[i] = i, entries[a]
	}
	return slabs, kept
}

// freshInMemory is the most bytes of fresh pieces [slabber.readFresh]
// reads into memory (a variable: tests take the other path).
var freshInMemory uint64 = 64 << 20

// readFresh reads the pieces fresh of ps from the staged pages file, back
// to back in that order, if they are at most freshInMemory bytes; else it
// returns nil.
func (c *slabber) readFresh(ps []piece, fresh []int) ([]byte, error) {
	var n uint64
	for _, i := range fresh {
		if n += ps[i].size; n > freshInMemory {
			return nil, nil
		}
	}
	f, err := os.Open(filepath.Join(c.dir, c.name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	var off uint64
	for _, i := range fresh {
		if _, err := f.ReadAt(b[off:off+ps[i].size], int64(ps[i].at)); err != nil {
			return nil, err
		}
		off += ps[i].size
	}
	return b, nil
}

// writeSlab stages slab number n: the pieces fresh of ps, back to back,
// each distinct one once, read from src (readFresh's) or if it is nil
// from the staged pages file; it sets their records in index, each
// chunk's address hashed from the bytes written, and returns the slab's
// size and address.
func (c *slabber) writeSlab(ps []piece, fresh []int, index []store.SlabChunk, n int, src []byte) (store.Hashed, error) {
	var from io.ReaderAt = bytes.NewReader(src)
	if src == nil {
		f, err := os.Open(filepath.Join(c.dir, c.name))
		if err != nil {
			return store.Hashed{}, err
		}
		defer f.Close()
		from = f
	}
	out, err := os.OpenFile(filepath.Join(c.dir, store.SlabName(c.name, n)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, c.mode)
	if err != nil {
		return store.Hashed{}, err
	}
	h := blake3.New(32, nil)
	w := bufio.NewWriterSize(io.MultiWriter(out, h), 1<<20)
	at := map[record.Address]uint64{}
	buf := make([]byte, ChunkSize)
	var off, read uint64
	for _, i := range fresh {
		pc := ps[i]
		b := buf[:pc.size]
		where := pc.at
		if src != nil {
			where, read = read, read+pc.size
		}
		if _, err := from.ReadAt(b, int64(where)); err != nil {
			out.Close()
			return store.Hashed{}, err
		}
		a := record.Sum(b)
		index[i].Slab, index[i].Address = n, a
		if o, ok := at[a]; ok {
			index[i].Offset = o
			continue
		}
		if _, err := w.Write(b); err != nil {
			out.Close()
			return store.Hashed{}, err
		}
		at[a], index[i].Offset = off, off
		off += pc.size
	}
	if err := w.Flush(); err != nil {
		out.Close()
		return store.Hashed{}, err
	}
	if err := out.Chmod(c.mode); err != nil { // past the umask: the mode listed
		out.Close()
		return store.Hashed{}, err
	}
	if err := out.Close(); err != nil {
		return store.Hashed{}, err
	}
	hs := store.Hashed{Size: int64(off)}
	h.Sum(hs.Address[:0])
	return hs, nil
}

// writeMode writes b to the new file p with mode, past the umask.
func writeMode(p string, b []byte, mode os.FileMode) error {
	if err := os.WriteFile(p, b, mode); err != nil {
		return err
	}
	return os.Chmod(p, mode)
}

// roomForPages is the room a layout may write pages into: the store's
// filesystem's free space past DefaultMinFree.
var roomForPages = func(st *store.Store) (uint64, error) { return Free(st, DefaultMinFree) }

// assemble lays out, in a CRIU image directory laid out by
// store.Materialize, each chunked pages file whole again, after checking
// that its chunks cover exactly the present pages of the file's pagemap
// (a refusal wraps store.ErrChunks): a slab that holds the file's chunks
// in order and nothing else is renamed to it (a hard link to the stored
// slab: no byte moves); any other file is written from its chunks,
// copied in the kernel (copy_file_range: on a filesystem that shares
// extents, none is copied), a run of chunks that follow one another in a
// slab at a time. The chunk and slab directories are removed.
func assemble(st *store.Store, mem record.Address, images string) error {
	es, err := st.Listing(mem)
	if err != nil {
		return err
	}
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil || len(cfs) == 0 {
		return err
	}
	// Each chunk is written out whole at its place, and a listing may name
	// one stored chunk at any number of places: what is written is judged
	// against the room left before a byte of it is.
	var total uint64
	for _, cf := range cfs {
		if !linkable(cf) {
			total += cf.Size // ChunkedFiles bounds them: no overflow
		}
	}
	if total > 0 {
		if room, err := roomForPages(st); err != nil || total > room {
			return fmt.Errorf("%w: the chunked pages of %s are %d bytes, the store's filesystem has %d left past its minimum free (%v)", ErrNoSpace, mem, total, room, err)
		}
	}
	pms, err := readPagemaps(images)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", store.ErrChunks, mem, err)
	}
	for _, cf := range cfs {
		if err := matchPagemap(cf, pms); err != nil {
			return fmt.Errorf("%w: %s: %q: %v", store.ErrChunks, mem, cf.Name, err)
		}
		if err := lay(images, cf); err != nil {
			return fmt.Errorf("park: assembling %q: %w", cf.Name, err)
		}
	}
	return nil
}

// linkable is whether cf is one slab holding its chunks in order, back
// to back from its start, and nothing else: the slab is the file.
func linkable(cf store.ChunkedFile) bool {
	if cf.Index == nil || len(cf.Slabs) != 1 || cf.Slabs[0].Size != cf.Size {
		return false
	}
	var off uint64
	for _, ch := range cf.Chunks {
		if ch.Offset != off {
			return false
		}
		off += ch.Size
	}
	return true
}

// matchPagemap checks that cf's chunks, in address order, are exactly the
// present pages of the pagemap that names cf as its pages file, with the
// runs in the same order (so the file CRIU reads holds each page where
// its pagemap says).
func matchPagemap(cf store.ChunkedFile, pms []pagemap) error {
	pm, err := pagemapOf(cf.Name, pms)
	if err != nil {
		return err
	}
	var runs []run
	for _, ch := range cf.Chunks {
		if n := len(runs); n > 0 && runs[n-1].vaddr+runs[n-1].bytes == ch.Vaddr {
			runs[n-1].bytes += ch.Size
			continue
		}
		runs = append(runs, run{ch.Vaddr, ch.Size})
	}
	if len(runs) != len(pm.runs) {
		return fmt.Errorf("%d runs of pages in chunks, %d in the pagemap", len(runs), len(pm.runs))
	}
	for i, r := range runs {
		if r != pm.runs[i] {
			return fmt.Errorf("chunks cover %#x+%d, the pagemap's run %d is %#x+%d", r.vaddr, r.bytes, i, pm.runs[i].vaddr, pm.runs[i].bytes)
		}
	}
	return nil
}

// lay writes cf whole under dir from its chunks' files laid out there
// (linkable's slab renamed, or the chunks copied), then removes them.
func lay(dir string, cf store.ChunkedFile) error {
	p := filepath.Join(dir, cf.Name)
	form := p + store.ChunkSuffix
	if cf.Index != nil {
		form = p + store.SlabSuffix
	}
	if linkable(cf) {
		if err := os.Rename(filepath.Join(dir, cf.Slabs[0].Name), p); err != nil {
			return err
		}
		return os.RemoveAll(form)
	}
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(cf.Chunks[0].Mode))
	if err != nil {
		return err
	}
	err = copyChunks(dir, out, cf)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.RemoveAll(form)
}

// copyChunks writes cf's chunks to out in order, from their files under
// dir, one copy_file_range per run of chunks that follow one another in
// one file.
func copyChunks(dir string, out *os.File, cf store.ChunkedFile) error {
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var wrote int64
	for i := 0; i < len(cf.Chunks); {
		ch := cf.Chunks[i]
		off, n := ch.Offset, ch.Size
		for i++; i < len(cf.Chunks) && cf.Chunks[i].In.Name == ch.In.Name && cf.Chunks[i].Offset == off+n; i++ {
			n += cf.Chunks[i].Size
		}
		in := files[ch.In.Name]
		if in == nil {
			var err error
			if in, err = os.Open(filepath.Join(dir, ch.In.Name)); err != nil {
				return err
			}
			files[ch.In.Name] = in
		}
		src := int64(off)
		for n > 0 {
			c, err := unix.CopyFileRange(int(in.Fd()), &src, int(out.Fd()), &wrote, int(n), 0)
			if err == unix.EINTR {
				continue
			}
			if err == nil && c == 0 {
				err = fmt.Errorf("%q ends before %d bytes at %d", ch.In.Name, n, src)
			}
			if err != nil {
				return err
			}
			n -= uint64(c)
		}
	}
	return nil
}
