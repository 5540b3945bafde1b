package park

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// lazyImages is chunkedImages with its pagemap's runs as a dump writes
// them: the first page (a stack's) eager, every other page lazy.
func lazyImages(pages []byte) map[string][]byte {
	im := chunkedImages(pages)
	b := bytes.Clone(im["pagemap-1.img"])
	// Each entry's flags field (4) is PE_PRESENT; all but the first
	// become PE_PRESENT|PE_LAZY.
	key := []byte{4 << 3, pePresent}
	first := bytes.Index(b, key)
	rest := bytes.ReplaceAll(b[first+2:], key, []byte{4 << 3, pePresent | peLazy})
	im["pagemap-1.img"] = append(b[:first+2], rest...)
	return im
}

// servedPark parks lazyImages(pages) with chunked images on.
func servedPark(t *testing.T, pages []byte) (*store.Store, Result) {
	t.Helper()
	st := mustStore(t)
	st.SetChunkedImages(true)
	p := &producer{t: t, images: lazyImages(pages), rootfs: content(42, 4096)}
	res, err := Image(t.Context(), st, p, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return st, res
}

// get asks a server of m for n pages at vaddr of task 1, as lazy-pages
// does, and returns what it sent or the error it stopped with.
func get(t *testing.T, m *pageserver.Table, vaddr, n uint64) ([]byte, error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	done := make(chan error, 1)
	go func() {
		err := pageserver.New(m).Serve(b)
		b.Close()
		done <- err
	}()
	h := make([]byte, 32)
	binary.NativeEndian.PutUint32(h, 7)
	binary.NativeEndian.PutUint64(h[8:], n)
	binary.NativeEndian.PutUint64(h[16:], vaddr)
	binary.NativeEndian.PutUint64(h[24:], 1)
	a.Write(h)
	if _, err := io.ReadFull(a, h); err != nil {
		return nil, <-done
	}
	out := make([]byte, binary.NativeEndian.Uint64(h[8:])*pageSize)
	if _, err := io.ReadFull(a, out); err != nil {
		t.Fatal(err)
	}
	a.Close()
	<-done
	return out, nil
}

// A served lazy resume: OfferedServed finds the park intact; LayoutServed
// lays the pages file out sparse, only the eager chunk in it, and its
// manifest serves every page as the pages file holds it, each lazy chunk
// to be verified, the eager one not (it was, before the restore).
func TestLayoutServed(t *testing.T) {
	pages := content(61, 600*pageSize)
	st, res := servedPark(t, pages)
	if off, err := OfferedServed(t.Context(), st, res.Snapshot); err != nil || !off.Equal(res.Snapshot) {
		t.Fatalf("offered %s, %v", off, err)
	}
	trees, m, err := LayoutServed(st, res.Snapshot, filepath.Join(t.TempDir(), "r"))
	if err != nil {
		t.Fatal(err)
	}
	laid, err := os.ReadFile(filepath.Join(trees.ImageDir, "pages-1.img"))
	if err != nil || len(laid) != len(pages) {
		t.Fatalf("laid-out pages file: %d bytes (%v), want %d", len(laid), err, len(pages))
	}
	if !bytes.Equal(laid[:pageSize], pages[:pageSize]) || !bytes.Equal(laid[pageSize:], make([]byte, len(pages)-pageSize)) {
		t.Fatal("the laid-out pages file is not the eager page and then a hole")
	}
	if _, err := os.Stat(filepath.Join(trees.ImageDir, "pages-1.img"+store.ChunkSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("chunks laid out: %v", err)
	}
	if len(m.Tasks) != 1 || m.Tasks[0].ID != 1 || len(m.Tasks[0].Extents) != 1+139+1+11 {
		t.Fatalf("manifest %+v", m.Tasks)
	}
	for i, e := range m.Tasks[0].Extents {
		if (e.Verify == nil) != (i == 0) {
			t.Fatalf("extent %d at %#x: verify %v", i, e.Vaddr, e.Verify)
		}
	}
	// The pages at 0x7f0000000000: the second run, from page 1 of the
	// file, 556 pages across two pagemap entries.
	got, err := get(t, m, 0x7f0000000000, 556)
	if err != nil || !bytes.Equal(got, pages[pageSize:557*pageSize]) {
		t.Fatalf("served %d bytes (%v), not the run's", len(got), err)
	}
	// The last run starts 3 pages into a chunk.
	got, err = get(t, m, 0x7f1000003000, 1)
	if err != nil || !bytes.Equal(got, pages[557*pageSize:558*pageSize]) {
		t.Fatalf("served %d bytes (%v), not the last run's first page", len(got), err)
	}
}

// slabAt is the file and offset where the slab holds the chunk at v of
// the park's pages-1.img.
func slabAt(t *testing.T, st *store.Store, res Result, v uint64) (string, uint64) {
	t.Helper()
	es, _ := st.Listing(*res.Snapshot.Memory)
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil || len(cfs) != 1 {
		t.Fatalf("chunked files %v, %v", cfs, err)
	}
	for _, ch := range cfs[0].Chunks {
		if ch.Vaddr == v {
			return st.Path(ch.In.Address), ch.Offset
		}
	}
	t.Fatalf("no chunk at %#x", v)
	return "", 0
}

// What each kind of damage does to a served lazy resume: a lazy chunk's
// is found as it is served (the server refuses it; the snapshot's
// listing is intact); an eager chunk's, or any other file's, makes
// another snapshot offered before the restore.
func TestOfferedServedDamage(t *testing.T) {
	pages := content(62, 600*pageSize)
	t.Run("a lazy chunk", func(t *testing.T) {
		st, res := servedPark(t, pages)
		p, off := slabAt(t, st, res, 0x7f0000004000)
		damageAt(t, p, off)
		if off, err := OfferedServed(t.Context(), st, res.Snapshot); err != nil || !off.Equal(res.Snapshot) {
			t.Fatalf("offered %s, %v: the listing is intact", off, err)
		}
		if off, _ := Offered(t.Context(), st, res.Snapshot); off.Equal(res.Snapshot) {
			t.Fatal("Offered found the damaged chunk intact")
		}
		_, m, err := LayoutServed(st, res.Snapshot, filepath.Join(t.TempDir(), "r"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := get(t, m, 0x7f0000000000, 4); err != nil {
			t.Fatalf("the chunk before it: %v", err)
		}
		if got, err := get(t, m, 0x7f0000005000, 1); !errors.Is(err, pageserver.ErrRefused) {
			t.Fatalf("served %d bytes of the damaged chunk (%v)", len(got), err)
		}
	})
	t.Run("the eager chunk", func(t *testing.T) {
		st, res := servedPark(t, pages)
		p, off := slabAt(t, st, res, 0x400000)
		damageAt(t, p, off)
		if off, err := OfferedServed(t.Context(), st, res.Snapshot); err != nil || off.Equal(res.Snapshot) {
			t.Fatalf("offered %s, %v, over a damaged eager chunk", off, err)
		}
	})
	t.Run("the core image", func(t *testing.T) {
		st, res := servedPark(t, pages)
		es, _ := st.Listing(*res.Snapshot.Memory)
		for _, e := range es {
			if e.Name == "core-1.img" {
				damage(t, st, e.Address)
			}
		}
		if off, err := OfferedServed(t.Context(), st, res.Snapshot); err != nil || off.Equal(res.Snapshot) {
			t.Fatalf("offered %s, %v, over a damaged core image", off, err)
		}
	})
	for _, which := range []string{"memory", "root"} {
		t.Run("the "+which+" listing", func(t *testing.T) {
			st, res := servedPark(t, pages)
			l := *res.Snapshot.Memory
			if which == "root" {
				l = *res.Snapshot.Root
			}
			damage(t, st, l)
			if off, err := OfferedServed(t.Context(), st, res.Snapshot); err == nil && off.Equal(res.Snapshot) {
				t.Fatalf("offered %s over a damaged %s listing", off, which)
			}
		})
	}
	t.Run("the root tree", func(t *testing.T) {
		st, res := servedPark(t, pages)
		es, _ := st.Listing(*res.Snapshot.Root)
		damage(t, st, es[0].Address)
		if off, err := OfferedServed(t.Context(), st, res.Snapshot); err != nil || off.Equal(res.Snapshot) {
			t.Fatalf("offered %s, %v, over a damaged root tree", off, err)
		}
	})
}

// A park whose pages file is whole (chunked images off) is served from
// that file, each run at its offset, with nothing left to verify.
func TestLayoutServedWhole(t *testing.T) {
	st := mustStore(t)
	pages := content(63, 600*pageSize)
	p := &producer{t: t, images: lazyImages(pages), rootfs: content(42, 4096)}
	res, err := Image(t.Context(), st, p, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if off, err := OfferedServed(t.Context(), st, res.Snapshot); err != nil || !off.Equal(res.Snapshot) {
		t.Fatalf("offered %s, %v", off, err)
	}
	trees, m, err := LayoutServed(st, res.Snapshot, filepath.Join(t.TempDir(), "r"))
	if err != nil {
		t.Fatal(err)
	}
	if laid, err := os.ReadFile(filepath.Join(trees.ImageDir, "pages-1.img")); err != nil || !bytes.Equal(laid, pages) {
		t.Fatalf("laid-out pages file: %d bytes, %v", len(laid), err)
	}
	if len(m.Tasks) != 1 || len(m.Tasks[0].Extents) != 3 {
		t.Fatalf("manifest %+v", m.Tasks)
	}
	for _, e := range m.Tasks[0].Extents {
		if e.Verify != nil {
			t.Fatalf("extent %+v to verify", e)
		}
	}
	got, err := get(t, m, 0x7f1000003000, 44)
	if err != nil || !bytes.Equal(got, pages[557*pageSize:]) {
		t.Fatalf("served %d bytes (%v), not the last run", len(got), err)
	}
}

// damage flips a byte of a stored object of any size.
func damage(t *testing.T, st *store.Store, a record.Address) {
	t.Helper()
	damageAt(t, st.Path(a), 0)
}

// damageAt flips a bit of byte 7 past off of file p.
func damageAt(t *testing.T, p string, off uint64) {
	t.Helper()
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, int64(off)+7); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x80
	if _, err := f.WriteAt(b, int64(off)+7); err != nil {
		t.Fatal(err)
	}
}

// servedLayout ingests a memory image of files (a name with a slash is a
// chunk: its directory is made) beside a root tree, and lays it out for a
// served resume; a refused layout must leave nothing behind.
func servedLayout(t *testing.T, st *store.Store, files map[string][]byte) (*pageserver.Table, error) {
	t.Helper()
	root := plainIngest(t, st, map[string][]byte{RootfsName: content(52, 100)})
	stage, err := st.StagingDir("hostile")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		p := filepath.Join(stage, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mem, _, err := st.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "r")
	_, m, err := LayoutServed(st, record.ImageSnapshot(root, &mem), dir)
	if err != nil {
		if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("a refused layout left %s: %v", dir, serr)
		}
	}
	return m, err
}

// The eager pages of all the chunked files of an image are judged against
// the room left at once, before any is written: two files each within
// the room but together past it are refused (ErrNoSpace).
func TestLayoutServedRoomForAllFiles(t *testing.T) {
	st := mustStore(t)
	files := map[string][]byte{
		"pagemap-1.img": pagemapImage(1, run{0x400000, 2 * pageSize}),
		"pagemap-2.img": pagemapImage(2, run{0x400000, 2 * pageSize}),
	}
	for i, name := range []string{"pages-1.img", "pages-2.img"} {
		for j := range uint64(2) {
			files[store.ChunkName(name, 0x400000+j*pageSize)] = content(uint64(70+2*i)+j, pageSize)
		}
	}
	defer func(f func(*store.Store) (uint64, error)) { roomForPages = f }(roomForPages)
	roomForPages = func(*store.Store) (uint64, error) { return 3 * pageSize, nil }
	if _, err := servedLayout(t, st, files); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("two files of 2 pages in the room of 3: %v", err)
	}
	roomForPages = func(*store.Store) (uint64, error) { return 4 * pageSize, nil }
	if _, err := servedLayout(t, st, files); err != nil {
		t.Fatalf("two files of 2 pages in the room of 4: %v", err)
	}
}

// A whole pages file is served only as the one pagemap that names it
// describes it whole: named by two pagemaps, or of a size other than its
// pagemap's runs, the image is refused (store.ErrChunks), so a small
// file cannot make a manifest many times its size.
func TestLayoutServedWholePagesNamedOnce(t *testing.T) {
	page := content(80, pageSize)
	for name, files := range map[string]map[string][]byte{
		"two pagemaps": {
			"pagemap-1.img": pagemapImage(1, run{0x400000, pageSize}),
			"pagemap-2.img": pagemapImage(1, run{0x400000, pageSize}),
			"pages-1.img":   page,
		},
		"a task's and another's": {
			"pagemap-1.img":       pagemapImage(1, run{0x400000, pageSize}),
			"pagemap-shmem-9.img": pagemapImage(1, run{0x400000, pageSize}),
			"pages-1.img":         page,
		},
		"longer than the runs": {
			"pagemap-1.img": pagemapImage(1, run{0x400000, pageSize}),
			"pages-1.img":   append(bytes.Clone(page), page...),
		},
		"shorter than the runs": {
			"pagemap-1.img": pagemapImage(1, run{0x400000, 2 * pageSize}),
			"pages-1.img":   page,
		},
	} {
		t.Run(name, func(t *testing.T) {
			if m, err := servedLayout(t, mustStore(t), files); !errors.Is(err, store.ErrChunks) {
				t.Fatalf("laid out, manifest %+v, %v", m, err)
			}
		})
	}
	// The chunked form: a chunked pages file named by two pagemaps.
	files := map[string][]byte{
		"pagemap-1.img":                          pagemapImage(1, run{0x400000, pageSize}),
		"pagemap-2.img":                          pagemapImage(1, run{0x400000, pageSize}),
		store.ChunkName("pages-1.img", 0x400000): page,
	}
	if m, err := servedLayout(t, mustStore(t), files); !errors.Is(err, store.ErrChunks) {
		t.Fatalf("chunked: laid out, manifest %+v, %v", m, err)
	}
}

// A lazy chunk its slab does not hold (the slab cut short past the eager
// page) is not looked for before the restore (the listing is intact):
// the page server refuses it when it is first asked for.
func TestOfferedServedLazyChunkObject(t *testing.T) {
	st, res := servedPark(t, content(64, 600*pageSize))
	p, _ := slabAt(t, st, res, 0x7f0000004000)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, pageSize); err != nil {
		t.Fatal(err)
	}
	if off, err := OfferedServed(t.Context(), st, res.Snapshot); err != nil || !off.Equal(res.Snapshot) {
		t.Fatalf("offered %s, %v: the listing is intact", off, err)
	}
	_, m, err := LayoutServed(st, res.Snapshot, filepath.Join(t.TempDir(), "r"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := get(t, m, 0x7f0000005000, 1); !errors.Is(err, pageserver.ErrRefused) {
		t.Fatalf("served %d bytes of a chunk its slab does not hold (%v)", len(got), err)
	}
}

// LayoutServed takes the listing OfferedServed found intact, once: with
// the listing's object gone from the store after the check, the layout
// of that resume still gives the same manifest as a layout that reads
// it, and the next one, with nothing kept, finds it missing. At most
// checkedMax are kept, the newest.
func TestLayoutServedTakesTheChecked(t *testing.T) {
	st, res := servedPark(t, content(63, 600*pageSize))
	_, want, err := LayoutServed(st, res.Snapshot, filepath.Join(t.TempDir(), "read"))
	if err != nil {
		t.Fatal(err)
	}
	if off, err := OfferedServed(t.Context(), st, res.Snapshot); err != nil || !off.Equal(res.Snapshot) {
		t.Fatalf("offered %s, %v", off, err)
	}
	listing := st.Path(*res.Snapshot.Memory)
	moved := listing + ".moved"
	if err := os.Rename(listing, moved); err != nil {
		t.Fatal(err)
	}
	_, got, err := LayoutServed(st, res.Snapshot, filepath.Join(t.TempDir(), "kept"))
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("layout from the checked listing: %v; manifests equal: %v", err, reflect.DeepEqual(got, want))
	}
	if _, _, err := LayoutServed(st, res.Snapshot, filepath.Join(t.TempDir(), "again")); !errors.Is(err, store.ErrMissingObject) {
		t.Fatalf("a second layout with the listing gone: %v", err)
	}
	if err := os.Rename(moved, listing); err != nil {
		t.Fatal(err)
	}

	// Kept by store and address; the newest checkedMax; none of a
	// listing over checkedMaxBytes.
	var c checkedListings
	c.byKey = map[checkedKey]checkedListing{}
	for i := range checkedMax + 1 {
		c.put(st, record.Sum([]byte{byte(i)}), checkedListing{es: make([]store.Entry, i)})
	}
	if _, ok := c.take(st, record.Sum([]byte{0})); ok {
		t.Fatal("the oldest is still kept")
	}
	if _, ok := c.take(mustStore(t), record.Sum([]byte{1})); ok {
		t.Fatal("another store took one")
	}
	for i := 1; i <= checkedMax; i++ {
		if l, ok := c.take(st, record.Sum([]byte{byte(i)})); !ok || len(l.es) != i {
			t.Fatalf("listing %d: kept %v", i, ok)
		}
	}
	big := []store.Entry{{Name: strings.Repeat("n", checkedMaxBytes)}}
	c.put(st, record.Sum([]byte("big")), checkedListing{es: big})
	if len(c.byKey) != 0 || len(c.order) != 0 {
		t.Fatalf("left after taking all, and one too big: %d, %d", len(c.byKey), len(c.order))
	}
}

// The manifest counts the userfaultfds lazy-pages holds: one per task
// pagemap, with lazy pages or not; a pagemap that is not a task's
// (shared memory) has none.
func TestLayoutServedCountsUffds(t *testing.T) {
	files := lazyImages(content(64, 600*pageSize))
	files["pagemap-7.img"] = pagemapImage(7, run{0x400000, pageSize})
	files["pages-7.img"] = content(65, pageSize)
	files["pagemap-shmem-9.img"] = pagemapImage(9, run{0, pageSize})
	files["pages-9.img"] = content(66, pageSize)
	m, err := servedLayout(t, mustStore(t), files)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Tasks) != 1 || m.Tasks[0].ID != 1 || m.Uffds != 2 {
		t.Fatalf("tasks %d, userfaultfds %d; want task 1 served, 2 held", len(m.Tasks), m.Uffds)
	}
}
