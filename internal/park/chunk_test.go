package park

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// pagemapImage encodes a pagemap image as CRIU 4 writes it: the magics,
// pagemap_head{pages_id}, then one present pagemap_entry{vaddr, flags,
// nr_pages} per run.
func pagemapImage(pagesID uint64, runs ...run) []byte {
	msgs := [][]uint64{{1, pagesID}}
	for _, r := range runs {
		msgs = append(msgs, []uint64{1, r.vaddr, 4, pePresent, 5, r.bytes / pageSize})
	}
	return pagemapMessages(msgs...)
}

// pagemapMessages encodes a pagemap image of the messages given, each as
// varint fields: field number, value, field number, value...
func pagemapMessages(msgs ...[]uint64) []byte {
	b := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	b = binary.LittleEndian.AppendUint32(b, pagemapMagic)
	for _, fields := range msgs {
		var m []byte
		for i := 0; i < len(fields); i += 2 {
			m = binary.AppendUvarint(m, fields[i]<<3)
			m = binary.AppendUvarint(m, fields[i+1])
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	return b
}

// chunkedImages is a CRIU image directory whose pages file is 2.4 MiB
// over three runs: one page, then two CRIU entries that continue one
// another (one run), then a run that starts mid-chunk.
func chunkedImages(pages []byte) map[string][]byte {
	pm := pagemapImage(1, run{0x400000, pageSize}, run{0x7f0000000000, 256 * pageSize}, run{0x7f0000100000, 300 * pageSize},
		run{0x7f1000003000, uint64(len(pages)) - 557*pageSize})
	return map[string][]byte{"pages-1.img": pages, "pagemap-1.img": pm, "core-1.img": content(43, 300)}
}

// With the store's chunked images on, an image park lists its pages file
// as 16 KiB chunks by virtual address, Offered finds it intact, Layout
// gives CRIU the pages file whole again, and a second park after one page
// changed stores only that page's chunk. A byte changed in a stored chunk
// makes a different snapshot offered: the resume precondition refuses it.
func TestImageChunked(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	pages := content(41, 600*pageSize)
	p := &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}
	res, err := Image(t.Context(), st, p, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es, err := st.Listing(*res.Snapshot.Memory)
	if err != nil {
		t.Fatal(err)
	}
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil || len(cfs) != 1 || cfs[0].Size != uint64(len(pages)) || res.Chunks.Chunks != len(cfs[0].Chunks) {
		t.Fatalf("chunked files %d, %v; stats %+v", len(cfs), err, res.Chunks)
	}
	// 1 + 556/4 + 43 (the last run starts 3 pages into a chunk: 1 + 42).
	if n := len(cfs[0].Chunks); n != 1+139+1+11 {
		t.Errorf("%d chunks", n)
	}
	for _, e := range es {
		if e.Name == "pages-1.img" {
			t.Fatal("the pages file is listed whole")
		}
	}
	if n, err := Retained(st, res.Snapshot); err != nil || n != res.Retained {
		t.Fatalf("retained %d, reported %d (%v)", n, res.Retained, err)
	}
	if off, err := Offered(t.Context(), st, res.Snapshot); err != nil || !off.Equal(res.Snapshot) {
		t.Fatalf("offered %s, %v", off, err)
	}
	dir := filepath.Join(t.TempDir(), "r")
	trees, err := Layout(st, res.Snapshot, dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range p.images {
		if got, err := os.ReadFile(filepath.Join(trees.ImageDir, name)); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s: %d bytes, %v", name, len(got), err)
		}
	}
	if _, err := os.Stat(filepath.Join(trees.ImageDir, "pages-1.img"+store.SlabSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("slabs left in the layout: %v", err)
	}
	// The first park's slab is the pages file: laid out by a link.
	if len(cfs[0].Slabs) != 1 || !sameFile(t, filepath.Join(trees.ImageDir, "pages-1.img"), st.Path(cfs[0].Slabs[0].Address)) {
		t.Fatalf("the first park's pages file is not its slab, linked: %d slabs", len(cfs[0].Slabs))
	}
	mustNoStaging(t, st.Dir())

	// One page changed: one chunk of 16 KiB is new.
	pages2 := bytes.Clone(pages)
	pages2[300*pageSize+7] ^= 1
	p2 := &producer{t: t, images: chunkedImages(pages2), rootfs: p.rootfs}
	res2, err := Image(t.Context(), st, p2, ImageOptions{Base: res.Snapshot.Memory})
	if err != nil {
		t.Fatal(err)
	}
	if res2.Chunks.New != ChunkSize || res2.Chunks.Held != res.Chunks.Chunks-1 {
		t.Fatalf("second park: %+v", res2.Chunks)
	}

	// The new slab and the index.
	if res2.NewBytes != ChunkSize+int64(len(store.EncodeSlabIndex(make([]store.SlabChunk, res.Chunks.Chunks)))) {
		t.Fatalf("second park added %d bytes", res2.NewBytes)
	}
	trees2, err := Layout(st, res2.Snapshot, filepath.Join(t.TempDir(), "r2"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(trees2.ImageDir, "pages-1.img")); err != nil || !bytes.Equal(got, pages2) {
		t.Fatalf("second pages file: %d bytes, %v", len(got), err)
	}

	// Nothing changed: no chunk is written, and the park goes through.
	p3 := &producer{t: t, images: chunkedImages(pages2), rootfs: p.rootfs}
	res3, err := Image(t.Context(), st, p3, ImageOptions{Base: res2.Snapshot.Memory})
	if err != nil {
		t.Fatalf("a park with every chunk held: %v", err)
	}
	if res3.Chunks.New != 0 || res3.NewBytes != 0 || !res3.Snapshot.Equal(res2.Snapshot) {
		t.Fatalf("third park: %+v, %d new bytes, %s (the second %s)", res3.Chunks, res3.NewBytes, res3.Snapshot, res2.Snapshot)
	}
	mustNoStaging(t, st.Dir())

	// A byte of a stored chunk changed: another snapshot is offered.
	c := cfs[0].Chunks[5]
	damageObject(t, st, c.In.Address)
	if off, err := Offered(t.Context(), st, res.Snapshot); err != nil || off.Equal(res.Snapshot) {
		t.Fatalf("offered %s over a damaged chunk, %v", off, err)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(x, y)
}

// damageObject flips a byte of a stored object through a layout's link
// (the test's way to reach the file without the store's paths).
func damageObject(t *testing.T, st *store.Store, a record.Address) {
	t.Helper()
	n, err := st.Size(a)
	if err != nil {
		t.Fatal(err)
	}
	l, err := store.EncodeListing([]store.Entry{{Name: "x", Mode: 0o600, Size: uint64(n), Address: a}})
	if err != nil {
		t.Fatal(err)
	}
	la, err := st.PutBytes(l, a)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "x")
	if err := st.Materialize(t.Context(), la, dst, store.LinkFiles); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dst, "x")
	os.Chmod(p, 0o600)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{0xff, 0, 0xff}, 100); err != nil {
		t.Fatal(err)
	}
}

// A chunked listing whose chunks do not cover exactly the present pages
// of its pagemap is refused by Layout with store.ErrChunks before CRIU
// reads it: a chunk moved to another address, a run missing, no pagemap.
func TestLayoutRefusesChunksAgainstPagemap(t *testing.T) {
	st := mustStore(t)
	page := content(51, pageSize)
	root := plainIngest(t, st, map[string][]byte{RootfsName: content(52, 100)})
	for name, c := range map[string]struct {
		pm     []byte
		chunks map[uint64][]byte
	}{
		"a chunk at another address": {pm: pagemapImage(1, run{0x400000, 2 * pageSize}), chunks: map[uint64][]byte{0x400000: page, 0x402000: page}},
		"a run missing":              {pm: pagemapImage(1, run{0x400000, pageSize}, run{0x500000, pageSize}), chunks: map[uint64][]byte{0x400000: page}},
		"a run too many":             {pm: pagemapImage(1, run{0x400000, pageSize}), chunks: map[uint64][]byte{0x400000: page, 0x500000: page}},
		"no pagemap":                 {chunks: map[uint64][]byte{0x400000: page}},
		"the pagemap of other pages": {pm: pagemapImage(2, run{0x400000, pageSize}), chunks: map[uint64][]byte{0x400000: page}},
	} {
		t.Run(name, func(t *testing.T) {
			stage, err := st.StagingDir("bad")
			if err != nil {
				t.Fatal(err)
			}
			os.Mkdir(filepath.Join(stage, "pages-1.img"+store.ChunkSuffix), 0o700)
			for v, b := range c.chunks {
				os.WriteFile(filepath.Join(stage, store.ChunkName("pages-1.img", v)), b, 0o600)
			}
			if c.pm != nil {
				os.WriteFile(filepath.Join(stage, "pagemap-1.img"), c.pm, 0o600)
			}
			mem, _, err := st.Ingest(t.Context(), stage)
			if err != nil {
				t.Fatal(err)
			}
			snap := record.ImageSnapshot(root, &mem)
			dir := filepath.Join(t.TempDir(), "r")
			if _, err := Layout(st, snap, dir); !errors.Is(err, store.ErrChunks) {
				t.Fatalf("layout: %v", err)
			} else if !strings.Contains(err.Error(), "pages-1.img") {
				t.Fatalf("layout: %v names no file", err)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused layout left %s: %v", dir, err)
			}
		})
	}
}

// parsePagemap reads what pagemapImage writes, merging entries that
// continue one another, and refuses what is not a pagemap.
func TestParsePagemap(t *testing.T) {
	pm, err := parsePagemap(pagemapImage(3, run{0x1000, 2 * pageSize}, run{0x3000, pageSize}, run{0x9000, pageSize}))
	if err != nil || pm.pages != "pages-3.img" || len(pm.runs) != 2 || pm.runs[0] != (run{0x1000, 3 * pageSize}) || pm.bytes != 4*pageSize {
		t.Fatalf("%+v, %v", pm, err)
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": pagemapImage(1, run{0x1000, pageSize})[:15],
		"overflow":  pagemapImage(1, run{0xfffffffffffff000, 2 * pageSize}),
		"unaligned": pagemapImage(1, run{0x1001, pageSize}),
		"no head":   pagemapImage(1)[:8],
	} {
		if _, err := parsePagemap(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// chunkedLayout ingests a chunked memory image whose pages-1.img is the
// chunks given, with the files extra beside it, and lays it out.
func chunkedLayout(t *testing.T, st *store.Store, chunks map[uint64][]byte, extra map[string][]byte) error {
	t.Helper()
	root := plainIngest(t, st, map[string][]byte{RootfsName: content(52, 100)})
	stage, err := st.StagingDir("hostile")
	if err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(stage, "pages-1.img"+store.ChunkSuffix), 0o700)
	for v, b := range chunks {
		os.WriteFile(filepath.Join(stage, store.ChunkName("pages-1.img", v)), b, 0o600)
	}
	for name, b := range extra {
		os.WriteFile(filepath.Join(stage, name), b, 0o600)
	}
	mem, _, err := st.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "r")
	_, err = Layout(st, record.ImageSnapshot(root, &mem), dir)
	if err != nil {
		if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("a refused layout left %s: %v", dir, serr)
		}
	}
	return err
}

// A chunked image whose pages would take more than the room the store's
// filesystem has left is refused before a byte of it is written: a bundle
// may list one stored chunk under any number of addresses, each written
// out whole at its place (ErrNoSpace).
func TestLayoutRefusesPagesPastTheRoomLeft(t *testing.T) {
	st := mustStore(t)
	page := content(53, pageSize)
	chunks := map[uint64][]byte{}
	for i := range uint64(8) {
		chunks[0x400000+i*pageSize] = page // one object, eight places
	}
	pm := pagemapImage(1, run{0x400000, 8 * pageSize})
	defer func(f func(*store.Store) (uint64, error)) { roomForPages = f }(roomForPages)
	roomForPages = func(*store.Store) (uint64, error) { return 7 * pageSize, nil }
	if err := chunkedLayout(t, st, chunks, map[string][]byte{"pagemap-1.img": pm}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("pages past the room left: %v", err)
	}
	roomForPages = func(*store.Store) (uint64, error) { return 8 * pageSize, nil }
	if err := chunkedLayout(t, st, chunks, map[string][]byte{"pagemap-1.img": pm}); err != nil {
		t.Fatalf("pages within the room left: %v", err)
	}
}

// The pagemaps of a chunked image are read only up to maxPagemaps files
// and maxPagemap bytes in all: one pagemap listed under many names is not
// parsed many times over.
func TestLayoutBoundsThePagemaps(t *testing.T) {
	st := mustStore(t)
	page := content(54, pageSize)
	pm := pagemapImage(1, run{0x400000, pageSize})
	many := map[string][]byte{"pagemap-1.img": pm}
	for i := 2; i <= maxPagemaps+1; i++ {
		many[fmt.Sprintf("pagemap-%d.img", i)] = pagemapImage(uint64(i), run{0x400000, pageSize})
	}
	if err := chunkedLayout(t, st, map[uint64][]byte{0x400000: page}, many); !errors.Is(err, store.ErrChunks) {
		t.Fatalf("%d pagemaps: %v", len(many), err)
	}
	big := bytes.Repeat([]byte{0}, maxPagemap/2+1)
	two := map[string][]byte{"pagemap-1.img": append(append([]byte{}, pm...), big...), "pagemap-2.img": append(pagemapImage(2), big...)}
	if err := chunkedLayout(t, st, map[uint64][]byte{0x400000: page}, two); !errors.Is(err, store.ErrChunks) || !strings.Contains(err.Error(), "in all") {
		t.Fatalf("pagemaps past %d bytes in all: %v", maxPagemap, err)
	}
}

// A base index this process did not make (imported, or written before a
// restart) is not trusted: a chunk whose address it gives is listed in
// its slab only when the bytes there are the park's. A lying index,
// whose record for one chunk carries the address of the next park's
// bytes, does not make that park list the old bytes: it stores the chunk
// again, and its layout is its own pages.
func TestImageChunkedLyingBase(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	pages := content(71, 600*pageSize)
	res, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pages2 := bytes.Clone(pages)
	pages2[300*pageSize+7] ^= 1
	es, err := st.Listing(*res.Snapshot.Memory)
	if err != nil {
		t.Fatal(err)
	}
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil || len(cfs) != 1 {
		t.Fatal(cfs, err)
	}
	// The index, lying about the chunk that changes.
	cs := make([]store.SlabChunk, len(cfs[0].Chunks))
	var lied bool
	for i, ch := range cfs[0].Chunks {
		cs[i] = store.SlabChunk{Vaddr: ch.Vaddr, Size: ch.Size, Offset: ch.Offset, Address: ch.Address}
		if ch.Offset <= 300*pageSize+7 && 300*pageSize+7 < ch.Offset+ch.Size {
			cs[i].Address, lied = record.Sum(pages2[ch.Offset:ch.Offset+ch.Size]), true
		}
	}
	if !lied {
		t.Fatal("no chunk holds the changed byte")
	}
	idx := store.EncodeSlabIndex(cs)
	forged := map[string][]byte{store.SlabIndexName("pages-1.img"): idx, store.SlabName("pages-1.img", 0): pages}
	for _, e := range es {
		if !store.InChunkedForm(e.Name) {
			b, err := st.ReadAll(e.Address)
			if err != nil {
				t.Fatal(err)
			}
			forged[e.Name] = b
		}
	}
	dir, err := st.StagingDir("forged")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range forged {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base, _, err := st.Ingest(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	res2, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages2), rootfs: content(42, 4096)}, ImageOptions{Base: &base})
	if err != nil {
		t.Fatal(err)
	}
	if res2.Chunks.New != ChunkSize || res2.Chunks.Held != res.Chunks.Chunks-1 {
		t.Fatalf("a park on a lying base: %+v", res2.Chunks)
	}
	trees, err := Layout(st, res2.Snapshot, filepath.Join(t.TempDir(), "r"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(trees.ImageDir, "pages-1.img")); err != nil || !bytes.Equal(got, pages2) {
		t.Fatalf("the park on a lying base lays out %d bytes that are not its pages (%v)", len(got), err)
	}
}

// An index this process made is trusted only with the slabs it was made
// with: a forged listing naming that index beside another slab of the
// same size (its bytes changed in one chunk) does not make a later park
// list that chunk in the forged slab, and the park lays out its own pages.
func TestImageChunkedMadeIndexForgedSlab(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	pages := content(73, 600*pageSize)
	res, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es, err := st.Listing(*res.Snapshot.Memory)
	if err != nil {
		t.Fatal(err)
	}
	forgedPages := bytes.Clone(pages)
	forgedPages[300*pageSize+7] ^= 1
	forged := map[string][]byte{store.SlabName("pages-1.img", 0): forgedPages}
	for _, e := range es {
		if e.Name == store.SlabName("pages-1.img", 0) {
			continue
		}
		b, err := st.ReadAll(e.Address)
		if err != nil {
			t.Fatal(err)
		}
		forged[e.Name] = b // the index this process made, and the rest
	}
	dir, err := st.StagingDir("forged")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range forged {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base, _, err := st.Ingest(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	res2, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}, ImageOptions{Base: &base})
	if err != nil {
		t.Fatal(err)
	}
	if res2.Chunks.New != ChunkSize {
		t.Errorf("a park on a forged slab: %+v", res2.Chunks)
	}
	trees, err := Layout(st, res2.Snapshot, filepath.Join(t.TempDir(), "r"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(trees.ImageDir, "pages-1.img")); err != nil || !bytes.Equal(got, pages) {
		t.Fatalf("the park on a forged slab lays out %d bytes that are not its pages (%v)", len(got), err)
	}
}

// A run's first park, without a base, lists the chunks it shares with
// the newest park of its kin in that park's slabs; a run of another kin
// shares none, nor does one sharing little of the kin's slab or whose
// kin's run is closed, and a kin park whose slab was collected stores
// every chunk rather than failing.
func TestImageChunkedKin(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	pages := content(41, 600*pageSize)
	runs, heads := 0, map[string]record.Address{}
	park := func(pages []byte, kin string) Result {
		t.Helper()
		runs++
		run := fmt.Sprintf("r%d", runs)
		u, err := st.PutBytes([]byte(run + " unit"))
		if err != nil {
			t.Fatal(err)
		}
		if heads[run], err = st.Create(run, u, u); err != nil {
			t.Fatal(err)
		}
		p := &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}
		res, err := Image(t.Context(), st, p, ImageOptions{Kin: kin, Run: run})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a := park(pages, "key image")
	slab := func(res Result) store.Entry {
		t.Helper()
		es, err := st.Listing(*res.Snapshot.Memory)
		if err != nil {
			t.Fatal(err)
		}
		cfs, err := store.ChunkedFiles(es, st.ReadIndex)
		if err != nil || len(cfs) != 1 || len(cfs[0].Slabs) == 0 {
			t.Fatalf("chunked files %d, %v", len(cfs), err)
		}
		return cfs[0].Slabs[0]
	}
	pages2 := bytes.Clone(pages)
	pages2[300*pageSize+7] ^= 1
	b := park(pages2, "key image")
	if b.Chunks.Held != a.Chunks.Chunks-1 || b.Chunks.New != ChunkSize {
		t.Fatalf("a kin's first park: %+v", b.Chunks)
	}
	trees, err := Layout(st, b.Snapshot, filepath.Join(t.TempDir(), "b"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(trees.ImageDir, "pages-1.img")); err != nil || !bytes.Equal(got, pages2) {
		t.Fatalf("the kin's pages file: %d bytes, %v", len(got), err)
	}
	if off, err := Offered(t.Context(), st, b.Snapshot); err != nil || !off.Equal(b.Snapshot) {
		t.Fatalf("offered %s, %v", off, err)
	}
	// A kin's slab holding little of a park is not listed in it: 10 of
	// 600 pages shared.
	few := content(44, 600*pageSize)
	copy(few, pages[:10*pageSize])
	if c := park(few, "key image"); c.Chunks.Held != 0 || c.Chunks.New != int64(len(few)) {
		t.Fatalf("a kin's park sharing 10 of 600 pages: %+v", c.Chunks)
	}
	// Pages alike within a park count once against the kin's slab: 300
	// zero pages here and one zero chunk there are 16 KiB of it.
	zeros := content(46, 600*pageSize)
	clear(zeros[pageSize : 5*pageSize]) // one chunk of 16 KiB
	park(zeros, "zeros")
	mostlyZero := content(47, 600*pageSize)
	clear(mostlyZero[pageSize : 301*pageSize])
	if c := park(mostlyZero, "zeros"); c.Chunks.Held != 0 {
		t.Fatalf("a kin's park sharing one zero chunk 75 times: %+v", c.Chunks)
	}
	if c := park(pages, "other image"); c.Chunks.Held != 0 {
		t.Fatalf("another kin's park held %d chunks", c.Chunks.Held)
	}
	if c := park(pages, ""); c.Chunks.Held != 0 {
		t.Fatalf("a park of no kin held %d chunks", c.Chunks.Held)
	}

	// A closed run's park is no kin's: its snapshots' retention is its
	// own.
	closing := content(45, 600*pageSize)
	park(closing, "closing")
	closed := fmt.Sprintf("r%d", runs)
	if _, err := st.Append(closed, heads[closed], record.Closure("done")); err != nil {
		t.Fatal(err)
	}
	if c := park(closing, "closing"); c.Chunks.Held != 0 {
		t.Fatalf("a park whose kin's run is closed held %d chunks", c.Chunks.Held)
	}

	// The kin's slab collected: every chunk is stored anew.
	pages3 := content(43, 600*pageSize)
	d := park(pages3, "gone")
	if err := os.Remove(st.Path(slab(d).Address)); err != nil {
		t.Fatal(err)
	}
	if e := park(pages3, "gone"); e.Chunks.Held != 0 || e.Chunks.New != int64(len(pages3)) {
		t.Fatalf("a park whose kin's slab is gone: %+v", e.Chunks)
	}
	mustNoStaging(t, st.Dir())
}

// A park whose base holds chunks stores its rw layer, whose ingest syncs
// the filesystem, only once its staged pages file is gone: a syncfs
// before would write the file back, mostly held chunks, for nothing. A
// first park stores it at once, beside the chunking.
func TestImageLaterRootAfterPut(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	var staged []int // pages files staged when each rw layer's ingest began
	defer func(f func(context.Context, *store.Store, string) (record.Address, store.IngestStats, error)) {
		ingestRootfs = f
	}(ingestRootfs)
	ingestRootfs = func(ctx context.Context, st *store.Store, dir string) (record.Address, store.IngestStats, error) {
		ps, err := filepath.Glob(filepath.Join(filepath.Dir(dir), "criu-*", "images", "pages-*.img"))
		if err != nil {
			t.Error(err)
		}
		staged = append(staged, len(ps))
		return st.Ingest(ctx, dir)
	}
	pages := content(41, 600*pageSize)
	res, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pages[7] ^= 1
	if _, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}, ImageOptions{Base: res.Snapshot.Memory}); err != nil {
		t.Fatal(err)
	}
	if len(staged) != 2 || staged[1] != 0 {
		t.Fatalf("pages files staged as each rw layer's ingest began: %v; want the later park's gone", staged)
	}
}

// With a base this process made, a chunk whose bytes are those of the
// base's chunk at its virtual address takes that chunk's address
// unhashed; a changed one is hashed. With a base it did not make, every
// chunk is hashed (the listing's addresses are not trusted).
func TestPlanUnchangedUnhashed(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	pages := content(41, 600*pageSize)
	res, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pages[300*pageSize+7] ^= 1
	for _, made := range []bool{true, false} {
		dir := t.TempDir()
		for n, b := range chunkedImages(pages) {
			if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		plans, err := planChunks(t.Context(), st, dir, heldChunks(baseFiles(st, res.Snapshot.Memory), made), func(string) map[uint64]earlyChunk { return nil })
		if err != nil || len(plans) != 1 {
			t.Fatalf("made %v: %d plans, %v", made, len(plans), err)
		}
		c := plans[0]
		want := 0
		if made {
			want = len(c.ps) - 1
		}
		if n := int(c.unchanged.Load()); n != want {
			t.Errorf("made %v: %d chunks taken unhashed, want %d", made, n, want)
		}
		held := 0
		for _, pc := range c.ps {
			if pc.addr != record.Sum(pages[pc.at:pc.at+pc.size]) {
				t.Fatalf("made %v: the chunk at %#x listed as %s", made, pc.vaddr, pc.addr)
			}
			if pc.in != nil {
				held++
			}
		}
		if held != len(c.ps)-1 {
			t.Errorf("made %v: %d of %d chunks held", made, held, len(c.ps))
		}
	}
}

// A chunk taken unhashed from a kin's slab (its bytes the same as the
// slab's there), in a park that then lists none of the kin's slabs, is
// hashed again from its bytes: were the slab's bytes changed after its
// park, the kin's address for them is not the park's.
func TestKinDroppedRehashed(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	intact := content(49, 600*pageSize)
	d, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(intact), rootfs: content(42, 4096)}, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es, err := st.Listing(*d.Snapshot.Memory)
	if err != nil {
		t.Fatal(err)
	}
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil || len(cfs) != 1 {
		t.Fatalf("chunked files %d, %v", len(cfs), err)
	}
	damageObject(t, st, cfs[0].Slabs[0].Address) // 3 bytes at 100: the chunk of page 0
	changed := content(50, 600*pageSize)
	copy(changed[:pageSize], intact[:pageSize])
	copy(changed[100:], []byte{0xff, 0, 0xff})
	dir := t.TempDir()
	for n, b := range chunkedImages(changed) {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := heldChunks(cfs, true)
	base.kin = true
	plans, err := planChunks(t.Context(), st, dir, base, func(string) map[uint64]earlyChunk { return nil })
	if err != nil || len(plans) != 1 || plans[0].unchanged.Load() != 1 {
		t.Fatalf("%d plans, %v", len(plans), err)
	}
	if _, cs, err := putChunks(plans, map[string]store.Hashed{}); err != nil || cs.Held != 0 {
		t.Fatalf("put: %+v, %v", cs, err)
	}
	for _, pc := range plans[0].ps {
		if want := record.Sum(changed[pc.at : pc.at+pc.size]); pc.addr != want {
			t.Fatalf("the chunk at %#x listed as %s, its bytes hash to %s", pc.vaddr, pc.addr, want)
		}
	}
}
