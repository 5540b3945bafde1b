package park

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// ChunkSize is the chunk of an image park's pages files in the chunked
// form: cut where the virtual address crosses a multiple of it and where
// a run of present pages ends (vaddr-16k, docs/chunked-images.md).
const ChunkSize = 16 << 10

// MinChunked is the smallest pages file stored in chunks; smaller ones,
// and every other file of the image, stay whole.
const MinChunked = 1 << 20

// ChunkStats is what the chunking of a park's pages files found.
type ChunkStats struct {
	Files  int   // pages files stored in chunks
	Chunks int   // their chunks
	Held   int   // chunks the store held already (not written again)
	New    int64 // bytes of the chunks it did not hold
}

// chunkImages puts each pages file of the staged image directory into the
// chunked form (store.ChunkedFiles): its chunks the store lacks are staged
// as files NAME.chunks/VADDR, hashed here (added to known), and those it
// holds are returned as entries to list without a staged copy
// ([store.Store.IngestChunks]). The pages file itself is removed from
// staging. known must not be nil. A pages file under [MinChunked], one whose size its pagemap
// does not give, one whose runs do not go up in address, or one of more
// than store.MaxChunks chunks (8 GiB at 16 KiB) stays whole.
func chunkImages(ctx context.Context, st *store.Store, images string, known map[string]store.Hashed) ([]store.Entry, ChunkStats, error) {
	var cs ChunkStats
	pms, err := readPagemaps(images)
	if err != nil {
		return nil, cs, fmt.Errorf("park: chunking: %w", err)
	}
	var stored []store.Entry
	done := map[string]bool{}
	buf := make([]byte, ChunkSize)
	for _, pm := range pms {
		info, err := os.Stat(filepath.Join(images, pm.pages))
		if err != nil || done[pm.pages] || info.Size() < MinChunked || uint64(info.Size()) != pm.bytes || !pm.increasing() ||
			len(pm.spans(ChunkSize)) > store.MaxChunks {
			continue
		}
		done[pm.pages] = true
		c := chunker{st: st, dir: images, name: pm.pages, mode: info.Mode().Perm(), known: known, buf: buf}
		if err := c.chunk(ctx, pm); err != nil {
			return nil, cs, fmt.Errorf("park: chunking %s: %w", pm.pages, err)
		}
		stored = append(stored, c.stored...)
		cs.Files++
		cs.Chunks += c.chunks
		cs.Held += len(c.stored)
		cs.New += c.new
	}
	return stored, cs, nil
}

// chunker cuts one staged pages file into chunks.
type chunker struct {
	st     *store.Store
	dir    string
	name   string
	mode   os.FileMode
	known  map[string]store.Hashed
	buf    []byte
	stored []store.Entry
	seen   map[record.Address]bool
	chunks int
	new    int64
}

func (c *chunker) chunk(ctx context.Context, pm pagemap) error {
	p := filepath.Join(c.dir, c.name)
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.Mkdir(p+store.ChunkSuffix, 0o700); err != nil {
		return err
	}
	c.seen = map[record.Address]bool{}
	for _, sp := range pm.spans(ChunkSize) {
		if err := ctx.Err(); err != nil {
			return err
		}
		b := c.buf[:sp.bytes]
		if _, err := io.ReadFull(f, b); err != nil {
			return err
		}
		if err := c.put(sp.vaddr, b); err != nil {
			return err
		}
	}
	delete(c.known, c.name)
	if c.new == 0 {
		// Every chunk held: an empty directory has no place in a listing.
		if err := os.Remove(p + store.ChunkSuffix); err != nil {
			return err
		}
	}
	return os.Remove(p)
}

// put stages one chunk, or lists it as stored when the store holds its
// bytes already or this park staged them under another name.
func (c *chunker) put(vaddr uint64, b []byte) error {
	c.chunks++
	a := record.Sum(b)
	name := store.ChunkName(c.name, vaddr)
	if c.seen[a] || c.st.Has(a) {
		c.stored = append(c.stored, store.Entry{Name: name, Mode: uint32(c.mode), Size: uint64(len(b)), Address: a})
		return nil
	}
	c.seen[a] = true
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, b, c.mode); err != nil {
		return err
	}
	if err := os.Chmod(p, c.mode); err != nil { // past the umask: the mode listed
		return err
	}
	c.known[name] = store.Hashed{Size: int64(len(b)), Address: a}
	c.new += int64(len(b))
	return nil
}

// roomForPages is the room a layout may write pages into: the store's
// filesystem's free space past DefaultMinFree.
var roomForPages = func(st *store.Store) (uint64, error) { return Free(st, DefaultMinFree) }

// assemble lays out, in a CRIU image directory laid out by
// store.Materialize, each chunked pages file whole again: its chunks
// concatenated in address order, after checking that they cover exactly
// the present pages of the file's pagemap (a refusal wraps
// store.ErrChunks). The chunk directories are removed.
func assemble(st *store.Store, mem record.Address, images string) error {
	es, err := st.Listing(mem)
	if err != nil {
		return err
	}
	cfs, err := store.ChunkedFiles(es)
	if err != nil || len(cfs) == 0 {
		return err
	}
	// Each chunk is written out whole at its place, and a listing may name
	// one stored chunk at any number of places: what is written is judged
	// against the room left before a byte of it is.
	var total uint64
	for _, cf := range cfs {
		for _, ch := range cf.Chunks {
			total += ch.Size // ChunkedFiles bounds them: no overflow
		}
	}
	if room, err := roomForPages(st); err != nil || total > room {
		return fmt.Errorf("%w: the chunked pages of %s are %d bytes, the store's filesystem has %d left past its minimum free (%v)", ErrNoSpace, mem, total, room, err)
	}
	pms, err := readPagemaps(images)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", store.ErrChunks, mem, err)
	}
	for _, cf := range cfs {
		if err := matchPagemap(cf, pms); err != nil {
			return fmt.Errorf("%w: %s: %q: %v", store.ErrChunks, mem, cf.Name, err)
		}
		if err := concat(images, cf); err != nil {
			return fmt.Errorf("park: assembling %q: %w", cf.Name, err)
		}
	}
	return nil
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

// concat writes cf whole from its chunks laid out under dir, then removes
// them.
func concat(dir string, cf store.ChunkedFile) error {
	out, err := os.OpenFile(filepath.Join(dir, cf.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(cf.Chunks[0].Mode))
	if err != nil {
		return err
	}
	for _, ch := range cf.Chunks {
		in, err := os.Open(filepath.Join(dir, ch.Name))
		if err != nil {
			out.Close()
			return err
		}
		n, err := io.Copy(out, in)
		in.Close()
		if err == nil && uint64(n) != ch.Size {
			err = fmt.Errorf("chunk %q holds %d bytes, listed as %d", ch.Name, n, ch.Size)
		}
		if err != nil {
			out.Close()
			return err
		}
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(dir, cf.Name+store.ChunkSuffix))
}
