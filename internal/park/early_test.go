package park

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// waitEarly waits until the follower has hashed n chunks of name early.
func waitEarly(t *testing.T, fl *follower, name string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		fl.mu.Lock()
		ff := fl.files[name]
		fl.mu.Unlock()
		if ff != nil && ff.earlyN.Load() >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: fewer than %d chunks hashed early", name, n)
}

// The follower of a chunked park's pages file hashes, while the producer
// writes, the chunks the pagemap written so far cuts from the bytes
// already hashed whole, but the last (the next entry may go on with its
// run): each is the hash of its bytes at its offset. A pagemap written in
// two pieces, the second after the pages, gives its cuts as it grows. A
// file rewritten once hashed is not vouched for, nor are its chunks.
func TestFollowEarlyChunks(t *testing.T) {
	for _, rewrite := range []bool{false, true} {
		st := mustStore(t)
		images := imagesDir(t, st)
		pages := content(51, 600*pageSize)
		pm := chunkedImages(pages)["pagemap-1.img"]
		// The head and the first two entries (0x400000, then 256 pages
		// that the third entry continues).
		first := len(pagemapImage(1, run{0x400000, pageSize}, run{0x7f0000000000, 256 * pageSize}))
		fl := follow(t.Context(), images, followOptions{least: followMin, chunks: true})
		if err := os.WriteFile(filepath.Join(images, "pagemap-1.img"), pm[:first], 0o600); err != nil {
			t.Fatal(err)
		}
		appendSlowly(t, filepath.Join(images, "pages-1.img"), pages, 3)
		// The page at 0x400000 and 63 of the 64 chunks of 256 pages.
		waitEarly(t, fl, "pages-1.img", 64)
		appendTo(t, filepath.Join(images, "pagemap-1.img"), pm[first:])
		// All but the last of 152.
		waitEarly(t, fl, "pages-1.img", 151)
		if rewrite {
			time.Sleep(10 * time.Millisecond) // a later time, with no more bytes
			f, err := os.OpenFile(filepath.Join(images, "pages-1.img"), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte{pages[pageSize] ^ 1}, pageSize); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		known, _ := fl.finish()
		early := fl.earlyChunks("pages-1.img")
		if rewrite {
			if _, ok := known["pages-1.img"]; ok || early != nil {
				t.Fatalf("a file rewritten once hashed: vouched %v, %d chunks hashed early", ok, len(early))
			}
			continue
		}
		checkEarly(t, pages, early)
		var at uint64
		for i, sp := range mustPagemap(t, pm).spans(ChunkSize) {
			e, ok := early[at]
			switch {
			case i == 151:
				if ok && e.size == sp.bytes {
					t.Errorf("the last chunk, at %d, was hashed early", at)
				}
			case !ok || e.size != sp.bytes:
				t.Errorf("chunk %d at %d: %+v, want %d bytes", i, at, e, sp.bytes)
			}
			at += sp.bytes
		}
	}
}

// checkEarly checks that each chunk hashed early, guessed or not, is the
// hash of its bytes at its offset.
func checkEarly(t *testing.T, pages []byte, early map[uint64]earlyChunk) {
	t.Helper()
	for at, e := range early {
		if at+e.size > uint64(len(pages)) || e.addr != record.Sum(pages[at:at+e.size]) {
			t.Errorf("the chunk hashed early at %d, %d bytes, is not the hash of its bytes", at, e.size)
		}
	}
}

// The pagemap lags the pages: the follower guesses that its last run goes
// on, and hashes the chunks it would cut before the pagemap names them.
// Here it names only the first 257 of the pages' 600, and the chunks of
// the 556-page run are hashed early, all of them; a wrong guess past the
// run's end (the next run starts off the 16 KiB grid) is not taken.
func TestFollowEarlyGuessesRun(t *testing.T) {
	st := mustStore(t)
	images := imagesDir(t, st)
	pages := content(57, 600*pageSize)
	pm := chunkedImages(pages)["pagemap-1.img"]
	first := len(pagemapImage(1, run{0x400000, pageSize}, run{0x7f0000000000, 256 * pageSize}))
	fl := follow(t.Context(), images, followOptions{least: followMin, chunks: true})
	if err := os.WriteFile(filepath.Join(images, "pagemap-1.img"), pm[:first], 0o600); err != nil {
		t.Fatal(err)
	}
	appendSlowly(t, filepath.Join(images, "pages-1.img"), pages, 4)
	// The page at 0x400000 and the 139 chunks of the 556-page run.
	waitEarly(t, fl, "pages-1.img", 140)
	appendTo(t, filepath.Join(images, "pagemap-1.img"), pm[first:])
	known, _ := fl.finish()
	if _, ok := known["pages-1.img"]; !ok {
		t.Fatal("the follower does not vouch for the pages file")
	}
	early := fl.earlyChunks("pages-1.img")
	checkEarly(t, pages, early)
	sps := mustPagemap(t, pm).spans(ChunkSize)
	var at uint64
	taken := 0
	for _, sp := range sps {
		if e, ok := early[at]; ok && e.size == sp.bytes {
			taken++
		}
		at += sp.bytes
	}
	if taken < 140 {
		t.Errorf("%d of the final chunks hashed early, want at least 140", taken)
	}
}

func mustPagemap(t *testing.T, b []byte) pagemap {
	t.Helper()
	pm, err := parsePagemap(b)
	if err != nil {
		t.Fatal(err)
	}
	return pm
}

// A chunked park whose producer writes the pagemap before the pages takes
// the chunks hashed early, and its index holds each chunk's hash.
func TestImageChunkedEarly(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	pages := content(52, 600*pageSize)
	images := chunkedImages(pages)
	// The producer stops 1 MiB short of the pages' end until the follower
	// has hashed chunks early.
	hashed := make(chan struct{})
	var once sync.Once
	defer func(f func(string, int)) { hashedEarly = f }(hashedEarly)
	hashedEarly = func(name string, n int) {
		if name == "pages-1.img" {
			once.Do(func() { close(hashed) })
		}
	}
	p := &orderedProducer{t: t, order: []string{"pagemap-1.img", "core-1.img", "pages-1.img"}, images: images,
		pause: map[string]pause{"pages-1.img": {at: len(pages) - 1<<20, until: hashed}}}
	res, err := Image(t.Context(), st, p, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Chunks.Early == 0 || res.Chunks.Early >= res.Chunks.Chunks {
		t.Errorf("%d of %d chunks hashed early", res.Chunks.Early, res.Chunks.Chunks)
	}
	es, err := st.Listing(*res.Snapshot.Memory)
	if err != nil {
		t.Fatal(err)
	}
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil || len(cfs) != 1 {
		t.Fatalf("%d chunked files, %v", len(cfs), err)
	}
	var at uint64
	for _, ch := range cfs[0].Chunks {
		if ch.Address != record.Sum(pages[at:at+ch.Size]) {
			t.Fatalf("chunk at %#x: listed %s, its bytes hash to %s", ch.Vaddr, ch.Address, record.Sum(pages[at:at+ch.Size]))
		}
		at += ch.Size
	}
}

// A later chunked park hashes its pages file's chunks early too, finds
// the unchanged ones in its base's slab by those hashes, and lists every
// chunk under the hash of its final bytes; it lays out its own pages.
func TestImageChunkedLaterEarly(t *testing.T) {
	for _, inMemory := range []uint64{freshInMemory, 0} {
		defer func(n uint64) { freshInMemory = n }(freshInMemory)
		freshInMemory = inMemory
		laterEarly(t)
	}
}

func laterEarly(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	pages := content(55, 600*pageSize)
	res, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pages2 := bytes.Clone(pages)
	pages2[10*pageSize+7] ^= 1
	pages2[590*pageSize+7] ^= 1
	hashed := make(chan struct{})
	var once sync.Once
	defer func(f func(string, int)) { hashedEarly = f }(hashedEarly)
	hashedEarly = func(name string, n int) {
		if name == "pages-1.img" {
			once.Do(func() { close(hashed) })
		}
	}
	p := &orderedProducer{t: t, order: []string{"pagemap-1.img", "core-1.img", "pages-1.img"}, images: chunkedImages(pages2),
		pause: map[string]pause{"pages-1.img": {at: len(pages2) - 1<<20, until: hashed}}}
	res2, err := Image(t.Context(), st, p, ImageOptions{Base: res.Snapshot.Memory})
	if err != nil {
		t.Fatal(err)
	}
	if c := res2.Chunks; c.Early == 0 || c.Held != c.Chunks-2 || c.New != 2*ChunkSize {
		t.Errorf("a later park: %+v", c)
	}
	if off, err := Offered(t.Context(), st, res2.Snapshot); err != nil || !off.Equal(res2.Snapshot) {
		t.Fatalf("offered %v, %v", off, err)
	}
	es, err := st.Listing(*res2.Snapshot.Memory)
	if err != nil {
		t.Fatal(err)
	}
	cfs, err := store.ChunkedFiles(es, st.ReadIndex)
	if err != nil || len(cfs) != 1 {
		t.Fatalf("%d chunked files, %v", len(cfs), err)
	}
	var at uint64
	for _, ch := range cfs[0].Chunks {
		if want := record.Sum(pages2[at : at+ch.Size]); ch.Address != want {
			t.Fatalf("chunk at %#x: listed %s, its bytes hash to %s", ch.Vaddr, ch.Address, want)
		}
		at += ch.Size
	}
	trees, err := Layout(st, res2.Snapshot, filepath.Join(t.TempDir(), "r"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(trees.ImageDir, "pages-1.img")); err != nil || !bytes.Equal(got, pages2) {
		t.Fatalf("the later park lays out %d bytes that are not its pages (%v)", len(got), err)
	}
}

// Chunks are hashed after the dump while the follower hashes its tail,
// with the early hashes it has made so far; if it then does not vouch
// for the file, they are made again. Here a later park's pages are
// rewritten once hashed early, back to the bytes of a chunk its base
// holds changed: the park lists its final bytes, not the base's.
func TestImageChunkedEarlyNotVouched(t *testing.T) {
	st := mustStore(t)
	st.SetChunkedImages(true)
	pages := content(56, 600*pageSize)
	res, err := Image(t.Context(), st, &producer{t: t, images: chunkedImages(pages), rootfs: content(42, 4096)}, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hashed := make(chan struct{})
	var once sync.Once
	defer func(f func(string, int)) { hashedEarly = f }(hashedEarly)
	hashedEarly = func(name string, n int) {
		if name == "pages-1.img" && n >= 100 {
			once.Do(func() { close(hashed) })
		}
	}
	const at = 10*pageSize + 7
	p := &rewritingProducer{t: t, images: chunkedImages(pages), hashed: hashed, at: at}
	res2, err := Image(t.Context(), st, p, ImageOptions{Base: res.Snapshot.Memory})
	if err != nil {
		t.Fatal(err)
	}
	final := bytes.Clone(pages)
	final[at] ^= 1
	trees, err := Layout(st, res2.Snapshot, filepath.Join(t.TempDir(), "r"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(trees.ImageDir, "pages-1.img")); err != nil || !bytes.Equal(got, final) {
		t.Fatalf("a park whose pages were rewritten once hashed lays out %d bytes that are not its final pages (%v); %+v", len(got), err, res2.Chunks)
	}
}

// rewritingProducer writes its images, then, once chunks of the pages are
// hashed early, flips the byte at of pages-1.img.
type rewritingProducer struct {
	t      *testing.T
	images map[string][]byte
	hashed <-chan struct{}
	at     int64
}

func (p *rewritingProducer) Checkpoint(ctx context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error) {
	if err := os.MkdirAll(cp.ImageDir, 0o700); err != nil {
		return executor.CheckpointStats{}, err
	}
	for _, name := range []string{"pagemap-1.img", "core-1.img", "pages-1.img"} {
		appendSlowly(p.t, filepath.Join(cp.ImageDir, name), p.images[name], 1)
	}
	select {
	case <-p.hashed:
	case <-time.After(10 * time.Second):
		p.t.Error("no chunk hashed early")
	}
	time.Sleep(10 * time.Millisecond) // a later time, with no more bytes
	f, err := os.OpenFile(filepath.Join(cp.ImageDir, "pages-1.img"), os.O_WRONLY, 0)
	if err != nil {
		return executor.CheckpointStats{}, err
	}
	_, err = f.WriteAt([]byte{p.images["pages-1.img"][p.at] ^ 1}, p.at)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return executor.CheckpointStats{}, err
	}
	return executor.CheckpointStats{}, os.WriteFile(cp.Rootfs, content(53, 4096), 0o600)
}

func (p *rewritingProducer) Settle(context.Context) error { return nil }

// orderedProducer writes its images one after another in order, each
// in appends with pauses (appendSlowly), and at a pause's offset in an
// image waits until its channel is closed (10 s at most).
type orderedProducer struct {
	t      *testing.T
	order  []string
	images map[string][]byte
	pause  map[string]pause
}

// pause is where an orderedProducer waits in an image, and for what.
type pause struct {
	at    int
	until <-chan struct{}
}

func (p *orderedProducer) Checkpoint(ctx context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error) {
	if err := os.MkdirAll(cp.ImageDir, 0o700); err != nil {
		return executor.CheckpointStats{}, err
	}
	for i, name := range p.order {
		path, b := filepath.Join(cp.ImageDir, name), p.images[name]
		ps, ok := p.pause[name]
		if !ok {
			appendSlowly(p.t, path, b, uint64(i))
			continue
		}
		appendSlowly(p.t, path, b[:ps.at], uint64(i))
		select {
		case <-ps.until:
		case <-time.After(10 * time.Second):
			p.t.Errorf("%s: waited 10 s at byte %d", name, ps.at)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return executor.CheckpointStats{}, err
		}
		_, err = f.Write(b[ps.at:])
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return executor.CheckpointStats{}, err
		}
	}
	return executor.CheckpointStats{}, os.WriteFile(cp.Rootfs, content(53, 4096), 0o600)
}

func (p *orderedProducer) Settle(context.Context) error { return nil }

// An early hash is listed only where the final bytes are checked against
// it: with no base, in the slab 00 stored under the follower's hash of the
// file; else a chunk written into a new slab, or into slab 00 with no
// such hash (a later park's follower makes none), is hashed again from
// the staged bytes. Here every early hash of a chunk not held is wrong.
func TestEarlyHashesCheckedWhereListed(t *testing.T) {
	st := mustStore(t)
	pages := content(54, 600*pageSize)
	var wrong record.Address
	wrong[0] = 1
	spans := mustPagemap(t, chunkedImages(pages)["pagemap-1.img"]).spans(ChunkSize)
	// The base holds the first half of the chunks, in a slab this
	// process made (trusted on the address), and is told their true hashes.
	baseSlab := store.Entry{Name: store.SlabName("pages-1.img", 0), Mode: 0o600, Size: uint64(len(pages)), Address: record.Sum(pages)}
	half := map[record.Address]heldAt{}
	honest := map[uint64]earlyChunk{}
	lying := map[uint64]earlyChunk{}
	var at uint64
	for i, sp := range spans {
		sum := record.Sum(pages[at : at+sp.bytes])
		lying[at] = earlyChunk{sp.bytes, wrong}
		honest[at] = earlyChunk{sp.bytes, wrong}
		if i < len(spans)/2 {
			half[sum] = heldAt{slab: baseSlab, offset: at, made: true}
			honest[at] = earlyChunk{sp.bytes, sum}
		}
		at += sp.bytes
	}
	for name, tc := range map[string]struct {
		held    map[record.Address]heldAt
		early   map[uint64]earlyChunk
		vouched bool // the follower hashed the file whole
		taken   bool // the early hashes are listed
	}{
		"no base, the file's hash": {early: lying, vouched: true, taken: true},
		"a base holding none":      {held: map[record.Address]heldAt{record.Sum([]byte("elsewhere")): {}}, early: lying},
		"a base holding half":      {held: half, early: honest},
	} {
		dir := t.TempDir()
		for n, b := range chunkedImages(pages) {
			if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		plans, err := planChunks(t.Context(), st, dir, based{held: tc.held}, func(string) map[uint64]earlyChunk { return tc.early })
		if err != nil || len(plans) != 1 {
			t.Fatalf("%s: %d plans, %v", name, len(plans), err)
		}
		known := map[string]store.Hashed{}
		if tc.vouched {
			known["pages-1.img"] = store.Hashed{Size: int64(len(pages)), Address: record.Sum(pages)}
		}
		if _, cs, err := putChunks(plans, known); err != nil || cs.Early != len(spans) {
			t.Fatalf("%s: %+v, %v", name, cs, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, store.SlabIndexName("pages-1.img")))
		if err != nil {
			t.Fatal(err)
		}
		slabs := []uint64{uint64(len(pages))}
		if len(tc.held) > 1 {
			slabs = append(slabs, uint64(len(pages)))
		}
		index, err := store.DecodeSlabIndex(b, slabs)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		at := uint64(0)
		for i, ch := range index {
			want := record.Sum(pages[at : at+ch.Size])
			if tc.taken {
				want = wrong
			}
			if ch.Address != want {
				t.Fatalf("%s: chunk %d at %d listed as %s, want %s", name, i, at, ch.Address, want)
			}
			at += ch.Size
		}
	}
}

// A later park's pages files are followed as later ones (no writeback, no
// hash of them whole) only if its base holds chunks: on a base parked
// whole they are likely stored as slab 00, and hashed whole as CRIU
// writes them.
func TestImageLaterOnlyOnChunkedBase(t *testing.T) {
	st := mustStore(t)
	var mu sync.Mutex
	started := 0
	defer func(f func(*os.File, int64, int64)) { writeback = f }(writeback)
	writeback = func(f *os.File, off, n int64) {
		if filepath.Base(f.Name()) == "pages-1.img" {
			mu.Lock()
			started++
			mu.Unlock()
		}
	}
	// The producer waits, past followMin of the pages, until they are
	// followed: else a slow scan can leave them to the ingest.
	var tracked chan struct{}
	defer func(f func(string)) { tracking = f }(tracking)
	tracking = func(name string) {
		if name == "pages-1.img" {
			close(tracked)
		}
	}
	var base *record.Address
	for i, tc := range []struct {
		chunked bool
		want    bool // a writeback of the pages started
	}{{false, true}, {true, true}, {true, false}} {
		st.SetChunkedImages(tc.chunked)
		mu.Lock()
		started = 0
		mu.Unlock()
		tracked = make(chan struct{})
		p := &orderedProducer{
			t: t, order: []string{"pagemap-1.img", "core-1.img", "pages-1.img"}, images: chunkedImages(content(uint64(60+i), 600*pageSize)),
			pause: map[string]pause{"pages-1.img": {at: followMin + 64*pageSize, until: tracked}},
		}
		res, err := Image(t.Context(), st, p, ImageOptions{Base: base})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := started > 0
		mu.Unlock()
		if got != tc.want {
			t.Errorf("park %d (chunked %v, base %v): writeback of the pages started %v, want %v", i+1, tc.chunked, base != nil, got, tc.want)
		}
		base = res.Snapshot.Memory
	}
}
