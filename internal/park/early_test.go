package park

import (
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
		dir, err := st.StagingDir("criu")
		if err != nil {
			t.Fatal(err)
		}
		images := filepath.Join(dir, "images")
		if err := os.Mkdir(images, 0o700); err != nil {
			t.Fatal(err)
		}
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
		f, err := os.OpenFile(filepath.Join(images, "pagemap-1.img"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(pm[first:]); err != nil {
			t.Fatal(err)
		}
		f.Close()
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
		if len(early) != 151 {
			t.Fatalf("%d chunks hashed early, want 151", len(early))
		}
		var at uint64
		for i, sp := range mustPagemap(t, pm).spans(ChunkSize) {
			e, ok := early[at]
			switch {
			case i == 151:
				if ok {
					t.Errorf("the last chunk, at %d, was hashed early", at)
				}
			case !ok || e.size != sp.bytes || e.addr != record.Sum(pages[at:at+sp.bytes]):
				t.Errorf("chunk %d at %d: %+v, want %d bytes hashed %s", i, at, e, sp.bytes, record.Sum(pages[at:at+sp.bytes]))
			}
			at += sp.bytes
		}
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
			p.t.Errorf("%s: no chunk hashed early", name)
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

// The hashes made early are taken by a park with no chunk held, and by no
// other: with a base, a chunk's hash decides where it is listed, so each
// is hashed from the staged bytes. Here every early hash is wrong.
func TestPlanChunksEarlyOnlyWithoutBase(t *testing.T) {
	st := mustStore(t)
	pages := content(54, 600*pageSize)
	var wrong record.Address
	wrong[0] = 1
	lying := map[uint64]earlyChunk{}
	var at uint64
	for _, sp := range mustPagemap(t, chunkedImages(pages)["pagemap-1.img"]).spans(ChunkSize) {
		lying[at] = earlyChunk{sp.bytes, wrong}
		at += sp.bytes
	}
	early := func(string) map[uint64]earlyChunk { return lying }
	someBase := map[record.Address]heldAt{record.Sum([]byte("elsewhere")): {}}
	for _, held := range []map[record.Address]heldAt{nil, someBase} {
		dir := t.TempDir()
		for name, b := range chunkedImages(pages) {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		plans, err := planChunks(t.Context(), st, dir, held, early)
		if err != nil || len(plans) != 1 {
			t.Fatalf("%d plans, %v", len(plans), err)
		}
		for _, pc := range plans[0].ps {
			taken := pc.addr == wrong
			if want := held == nil; taken != want || (!taken && pc.addr != record.Sum(pages[pc.at:pc.at+pc.size])) {
				t.Fatalf("base %v: the chunk at %d hashed %s (early taken %v, want %v)", held != nil, pc.at, pc.addr, taken, want)
			}
		}
	}
}
