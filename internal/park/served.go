package park

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A served lazy resume (docs/lazy-resume.md, "The page server"): the
// pages of a chunked pages file that lazy-pages will serve are verified
// chunk by chunk as they are served (internal/criu/pageserver), not before
// the restore. Before it, [OfferedServed] checks the memory image's
// listing against the recorded address — it names every chunk by its
// address — and rehashes every other file and every chunk holding an
// eager page (one CRIU's restore reads itself).

// OfferedServed is [Offered] for a lazy resume whose chunked pages are
// verified as served: it rehashes the root tree, the memory image's
// listing, every file of it that is not a chunk, and every chunk with a
// page its pagemap does not mark lazy; the other chunks are taken at the
// address the listing gives them: not even looked at (a stat of each of
// a large image's lazy chunks, from a cold cache, was most of the check:
// docs/benchmarks.md; the page server refuses a missing or changed one as
// it would a damaged one). The snapshot is offered as itself only
// when all of that is intact. A transcript park, or an image without
// chunked files, is rehashed whole, as Offered does.
func OfferedServed(ctx context.Context, st *store.Store, recorded record.Snapshot) (record.Snapshot, error) {
	return OfferedServedOwed(ctx, st, recorded, nil)
}

// OfferedServedOwed is [OfferedServed] of a snapshot whose memory image's
// slabs may be owed (owed: nil, none is): a chunk with an eager page in an
// owed slab is fetched first, then hashed where owed fills it.
func OfferedServedOwed(ctx context.Context, st *store.Store, recorded record.Snapshot, owed Owed) (record.Snapshot, error) {
	if recorded.IsTranscript() || recorded.Memory == nil {
		return Offered(ctx, st, recorded)
	}
	// The two trees at once: from a cold cache both wait on the disk.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var root record.Address
	var rerr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		root, rerr = st.RehashDir(ctx, *recorded.Root)
	}()
	mem, err := offeredMemory(ctx, st, *recorded.Memory, owed)
	if err != nil {
		cancel() // the root's answer no longer matters
	}
	<-done
	if err = errors.Join(rerr, err); err != nil {
		return record.Snapshot{}, fmt.Errorf("park: %w", err)
	}
	return record.ImageSnapshot(root, &mem), nil
}

// offeredMemory is OfferedServed's memory image: its address as offered
// now.
func offeredMemory(ctx context.Context, st *store.Store, mem record.Address, owed Owed) (record.Address, error) {
	es, got, err := st.RehashListing(ctx, mem)
	if err != nil || got != mem {
		return got, err
	}
	var whole []int
	for i, e := range es {
		if !isChunk(e.Name) {
			whole = append(whole, i)
		}
	}
	changed, err := st.RehashEntries(ctx, mem, es, whole)
	if err != nil {
		return record.Address{}, err
	}
	if changed {
		return store.ListingAddress(es)
	}
	// The indexes are intact now: read them.
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil {
		return record.Address{}, fmt.Errorf("%s: %w", mem, err)
	}
	// The pagemaps are intact now: which chunks hold eager pages.
	pms, err := readPagemapFiles(pagemapObjects(st, es))
	if err != nil {
		return record.Address{}, fmt.Errorf("%w: %s: %w", store.ErrChunks, mem, err)
	}
	var eager []int
	var inSlabs []store.Chunk
	for _, cf := range cfs {
		pm, err := pagemapOf(cf.Name, pms)
		if err != nil {
			return record.Address{}, fmt.Errorf("%w: %s: %q: %v", store.ErrChunks, mem, cf.Name, err)
		}
		for _, ch := range cf.Chunks {
			switch {
			case pm.isTask() && !pm.eagerIn(ch.Vaddr, ch.Size):
			case cf.Index != nil:
				inSlabs = append(inSlabs, ch)
			default:
				// A listing is in order of name: found, as
				// ChunkedFiles took the chunk from it.
				i, _ := slices.BinarySearchFunc(es, ch.Name, func(e store.Entry, n string) int { return strings.Compare(e.Name, n) })
				eager = append(eager, i)
			}
		}
	}
	if changed, err = st.RehashEntries(ctx, mem, es, eager); err != nil {
		return record.Address{}, err
	}
	if changed {
		return store.ListingAddress(es)
	}
	if bad, err := slabChunksChanged(ctx, st, inSlabs, owed); err != nil || bad != nil {
		if err != nil {
			return record.Address{}, err
		}
		// The slab holding a changed chunk, rehashed whole, makes the
		// address offered; an owed one, not all here, is offered as no
		// slab's (the zero address).
		i, _ := slices.BinarySearchFunc(es, bad.In.Name, func(e store.Entry, n string) int { return strings.Compare(e.Name, n) })
		if _, isOwed := owedPath(*bad, owed); isOwed {
			es[i].Address = record.Address{}
		} else if _, err := st.RehashEntries(ctx, mem, es, []int{i}); err != nil {
			return record.Address{}, err
		}
		return store.ListingAddress(es)
	}
	checked.put(st, mem, checkedListing{es, cfs})
	return mem, nil
}

// slabChunksChanged hashes each of chs, chunks in slabs, where its slab
// holds it (an owed slab: once fetched, in owed's file), and returns the
// first whose bytes there do not hash to its address.
func slabChunksChanged(ctx context.Context, st *store.Store, chs []store.Chunk, owed Owed) (*store.Chunk, error) {
	for i := range chs {
		ch := &chs[i]
		got, err := sumChunk(ctx, st, *ch, owed)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", ch.Name, err)
		}
		if got != ch.Address {
			return ch, nil
		}
	}
	return nil, nil
}

// isChunk is whether a listing's entry holds chunks of a chunked file: a
// chunk or a slab (not an index, which is read whole).
func isChunk(name string) bool {
	return store.InChunkedForm(name) && path.Base(name) != store.SlabIndexBase
}

// pagemapObjects are the pagemap images of a memory image's listing, as
// the objects that hold them.
func pagemapObjects(st *store.Store, es []store.Entry) []imageFile {
	var out []imageFile
	for _, e := range es {
		if ok, _ := path.Match("pagemap-*.img", e.Name); ok {
			out = append(out, imageFile{e.Name, st.Path(e.Address)})
		}
	}
	return out
}

// pagemapOf is the one pagemap that names pages file name.
func pagemapOf(name string, pms []pagemap) (*pagemap, error) {
	var pm *pagemap
	for i := range pms {
		if pms[i].pages == name {
			if pm != nil {
				return nil, fmt.Errorf("two pagemaps name it")
			}
			pm = &pms[i]
		}
	}
	if pm == nil {
		return nil, fmt.Errorf("no pagemap names it")
	}
	return pm, nil
}

// LayoutServed is [Layout] for a served lazy resume, after
// [OfferedServed] found the snapshot intact: it lays the image out by
// hard links except the chunks, writes each chunked pages file as a
// sparse file of its size holding only its eager chunks (the pages CRIU's
// restore reads itself; lazy-pages reads none), and returns the extent table
// the page server serves every task's pages by: a chunk's pages from the
// chunk's object, verified as served unless it holds eager pages (checked
// already); a whole pages file's from its object.
func LayoutServed(st *store.Store, snap record.Snapshot, dir string) (Trees, *pageserver.Table, error) {
	return LayoutServedOwed(st, snap, dir, nil)
}

// LayoutServedOwed is [LayoutServed] after [OfferedServedOwed] (owed: nil,
// none is): a chunk of an owed slab is served from the file owed fills,
// each lazy one fetched (owed.Fetch) before the page server reads it
// (pageserver.Extent.Owed, Table.Fetch); the eager ones were fetched
// already.
func LayoutServedOwed(st *store.Store, snap record.Snapshot, dir string, owed Owed) (Trees, *pageserver.Table, error) {
	t, m, err := layoutServed(st, snap, dir, owed)
	if err != nil {
		os.RemoveAll(dir)
		return Trees{}, nil, fmt.Errorf("park: %w", err)
	}
	return t, m, nil
}

func layoutServed(st *store.Store, snap record.Snapshot, dir string, owed Owed) (Trees, *pageserver.Table, error) {
	if snap.IsTranscript() || snap.Root == nil || snap.Memory == nil {
		return Trees{}, nil, fmt.Errorf("%s is not an image park with a memory image", snap)
	}
	t := Trees{ImageDir: filepath.Join(dir, "images"), Rootfs: filepath.Join(dir, "root", RootfsName)}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Trees{}, nil, err
	}
	ctx := context.Background() // nothing is hashed
	l, ok := checked.take(st, *snap.Memory)
	if !ok {
		var err error
		if l.es, err = st.Listing(*snap.Memory); err != nil {
			return Trees{}, nil, err
		}
		if l.cfs, err = store.ChunkedFiles(l.es, st.ReadIndex); err != nil {
			return Trees{}, nil, err
		}
	}
	es, cfs := l.es, l.cfs
	var whole []store.Entry
	for _, e := range es {
		if !store.InChunkedForm(e.Name) {
			whole = append(whole, e)
		}
	}
	if err := st.MaterializeListed(ctx, *snap.Memory, whole, t.ImageDir, store.LinkRehashed); err != nil {
		return Trees{}, nil, err
	}
	pms, err := readPagemaps(t.ImageDir)
	if err != nil {
		return Trees{}, nil, fmt.Errorf("%w: %s: %w", store.ErrChunks, *snap.Memory, err)
	}
	chunked := map[string]store.ChunkedFile{}
	for _, cf := range cfs {
		if err := matchPagemap(cf, pms); err != nil {
			return Trees{}, nil, fmt.Errorf("%w: %s: %q: %v", store.ErrChunks, *snap.Memory, cf.Name, err)
		}
		chunked[cf.Name] = cf
	}
	m, err := extentTable(st, es, pms, chunked, owed)
	if err != nil {
		return Trees{}, nil, fmt.Errorf("%s: %w", *snap.Memory, err)
	}
	if err := sparseAll(chunkFiles{st, owed}, t.ImageDir, *snap.Memory, cfs, pms); err != nil {
		return Trees{}, nil, err
	}
	if err := st.Materialize(ctx, *snap.Root, filepath.Dir(t.Rootfs), store.LinkRehashed); err != nil {
		return Trees{}, nil, err
	}
	if _, err := os.Stat(t.Rootfs); err != nil {
		return Trees{}, nil, fmt.Errorf("root %s holds no %s: %w", *snap.Root, RootfsName, err)
	}
	return t, m, nil
}

// sparseAll writes each chunked file of memory image mem under dir, as
// sparse does, after judging the eager chunks of them all against the
// room left, once, before a byte is written: files each within the room
// may not be within it together. Each file's pagemap is the one
// matchPagemap found; no two files share one, so there are at most
// maxPagemaps files, of at most MaxChunks chunks of MaxChunk bytes each,
// and the sum does not overflow.
func sparseAll(src chunkFiles, dir string, mem record.Address, cfs []store.ChunkedFile, pms []pagemap) error {
	eager := make([][]store.Chunk, len(cfs))
	var total uint64
	for i, cf := range cfs {
		pm, _ := pagemapOf(cf.Name, pms) // matchPagemap found exactly one
		eager[i] = eagerChunks(cf, pm)
		for _, ch := range eager[i] {
			total += ch.Size
		}
	}
	if room, err := roomForPages(src.st); err != nil || total > room {
		return fmt.Errorf("%w: the eager pages of %s are %d bytes, the store's filesystem has %d left past its minimum free (%v)", ErrNoSpace, mem, total, room, err)
	}
	for i, cf := range cfs {
		if err := sparse(src, dir, cf, eager[i]); err != nil {
			return fmt.Errorf("laying out %q: %w", cf.Name, err)
		}
	}
	return nil
}

// eagerChunks are the chunks of cf that hold eager pages of pm: every
// chunk of a pagemap that is not a task's.
func eagerChunks(cf store.ChunkedFile, pm *pagemap) []store.Chunk {
	var eager []store.Chunk
	for _, ch := range cf.Chunks {
		if !pm.isTask() || pm.eagerIn(ch.Vaddr, ch.Size) {
			eager = append(eager, ch)
		}
	}
	return eager
}

// sparse writes chunked file cf under dir at its full size, with only its
// eager chunks (eagerChunks, in cf's order) in place: the rest is a hole
// CRIU's restore does not read.
func sparse(src chunkFiles, dir string, cf store.ChunkedFile, eager []store.Chunk) error {
	out, err := os.OpenFile(filepath.Join(dir, cf.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(cf.Chunks[0].Mode))
	if err != nil {
		return err
	}
	if err := out.Truncate(int64(cf.Size)); err != nil {
		out.Close()
		return err
	}
	var off uint64
	next := 0
	for _, ch := range cf.Chunks {
		if next < len(eager) && eager[next].Name == ch.Name {
			next++
			b, err := readChunk(src, ch)
			if err == nil {
				_, err = out.WriteAt(b, int64(off))
			}
			if err != nil {
				out.Close()
				return err
			}
		}
		off += ch.Size
	}
	return out.Close()
}

// readChunk reads chunk ch's bytes from where the store holds them: a
// chunk's own object, all of it, or its range of its slab.
func readChunk(src chunkFiles, ch store.Chunk) ([]byte, error) {
	f, err := os.Open(src.path(ch))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if ch.In.Address == ch.Address {
		b, err := io.ReadAll(f)
		if err == nil && uint64(len(b)) != ch.Size {
			err = fmt.Errorf("chunk %q holds %d bytes, listed as %d", ch.Name, len(b), ch.Size)
		}
		return b, err
	}
	b := make([]byte, ch.Size)
	if _, err := f.ReadAt(b, int64(ch.Offset)); err != nil {
		return nil, fmt.Errorf("chunk %q at %d of %q: %w", ch.Name, ch.Offset, ch.In.Name, err)
	}
	return b, nil
}

// extentTable is the page server's extent table of every task's pages: per task
// pagemap with present pages, its chunks (a chunked pages file) or the
// runs of its whole pages file, in address order. A pages file named by
// more than one pagemap is refused (CRIU gives each pagemap a pages file
// of its own), and so is a whole one of another size than its pagemap's
// runs: else many pagemaps of many runs over one small file would make a
// table, which names the file once per extent, many times the image's
// size.
func extentTable(st *store.Store, es []store.Entry, pms []pagemap, chunked map[string]store.ChunkedFile, owed Owed) (*pageserver.Table, error) {
	objects := map[string]store.Entry{} // a whole pages file's object
	for _, e := range es {
		if !store.InChunkedForm(e.Name) {
			objects[e.Name] = e
		}
	}
	named := make(map[string]string, len(pms))
	for _, pm := range pms {
		if other, ok := named[pm.pages]; ok {
			return nil, fmt.Errorf("%w: %s and %s both name %s", store.ErrChunks, other, pm.name, pm.pages)
		}
		named[pm.pages] = pm.name
	}
	m := &pageserver.Table{}
	slabs := map[string]record.Address{} // an owed slab's, by its file
	for _, pm := range pms {
		id, ok := pm.task()
		if ok {
			m.Uffds++
		}
		if !ok || pm.bytes == 0 {
			continue
		}
		t := pageserver.Task{ID: id}
		if cf, ok := chunked[pm.pages]; ok {
			t.Extents = make([]pageserver.Extent, len(cf.Chunks))
			verify := make([]record.Address, len(cf.Chunks))
			for i, ch := range cf.Chunks {
				path, isOwed := owedPath(ch, owed)
				if !isOwed {
					path = st.Path(ch.In.Address)
				}
				t.Extents[i] = pageserver.Extent{Vaddr: ch.Vaddr, Size: ch.Size, Path: path, Offset: ch.Offset}
				if !pm.eagerIn(ch.Vaddr, ch.Size) {
					verify[i] = ch.Address
					t.Extents[i].Verify, t.Extents[i].Owed = &verify[i], isOwed
				}
				if isOwed {
					slabs[path] = ch.In.Address
				}
			}
		} else {
			e, ok := objects[pm.pages]
			if !ok {
				return nil, fmt.Errorf("%w: %s names %s, which the image does not hold", store.ErrChunks, pm.name, pm.pages)
			}
			if e.Size != pm.bytes {
				return nil, fmt.Errorf("%w: %s gives %s %d bytes of pages, it holds %d", store.ErrChunks, pm.name, pm.pages, pm.bytes, e.Size)
			}
			var off uint64
			for _, r := range pm.runs {
				t.Extents = append(t.Extents, pageserver.Extent{Vaddr: r.vaddr, Size: r.bytes, Path: st.Path(e.Address), Offset: off})
				off += r.bytes
			}
			sort.Slice(t.Extents, func(i, j int) bool { return t.Extents[i].Vaddr < t.Extents[j].Vaddr })
		}
		if !pm.hasLazy() {
			// No page lazy-pages will ask for; its userfaultfd is
			// still one lazy-pages holds (m.Uffds).
			continue
		}
		m.Tasks = append(m.Tasks, t)
	}
	// The rules the server relies on (address order, no overlap, no task
	// twice): an image that breaks them is refused here.
	if err := m.Check(); err != nil {
		return nil, err
	}
	if len(slabs) > 0 {
		m.Fetch = func(ctx context.Context, e pageserver.Extent) error {
			slab, ok := slabs[e.Path]
			if !ok {
				return fmt.Errorf("%w: no owed slab is filled in %s", store.ErrChunks, e.Path)
			}
			return owed.Fetch(ctx, slab, e.Offset, e.Size)
		}
	}
	return m, nil
}
