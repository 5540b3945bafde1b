package park

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// mustStore opens a store on t.TempDir, closed when the test ends.
func mustStore(t testing.TB) *store.Store {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	return st
}

// content is n bytes that differ from file to file.
func content(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// appendSlowly writes b to a new file at p as CRIU writes an image: in
// pieces of uneven sizes, appended, with pauses between them.
func appendSlowly(t testing.TB, p string, b []byte, seed uint64) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(seed, 1))
	for len(b) > 0 {
		n := min(len(b), 1+r.IntN(300<<10)) // not aligned to BLAKE3's chunks
		if _, err := f.Write(b[:n]); err != nil {
			t.Error(err)
			return
		}
		b = b[n:]
		if r.IntN(4) == 0 {
			time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond)
		}
	}
}

// imagesDir is a new staging directory's images directory, as a
// producer makes it.
func imagesDir(t *testing.T, st *store.Store) string {
	t.Helper()
	dir, err := st.StagingDir("criu")
	if err != nil {
		t.Fatal(err)
	}
	images := filepath.Join(dir, "images")
	if err := os.Mkdir(images, 0o700); err != nil {
		t.Fatal(err)
	}
	return images
}

// appendTo appends b to the file at p.
func appendTo(t *testing.T, p string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

// waitQuiet waits until the follower has hashed name to size and found
// it at its end.
func waitQuiet(t *testing.T, fl *follower, name string, size int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		fl.mu.Lock()
		ff := fl.files[name]
		fl.mu.Unlock()
		if ff != nil && ff.quietAt.Load() == size {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: not followed to its %d bytes", name, size)
}

// A producer writes files while they are followed: large ones in uneven
// appends with pauses, one that appears only late, an empty one and a
// small one. Every file the follower vouches for has the address a plain
// hash of its final bytes gives, and the directory object made from its
// hashes is the one Ingest makes without them.
func TestFollow(t *testing.T) {
	st := mustStore(t)
	for _, least := range []int64{0, followMin} {
		dir, err := st.StagingDir("criu")
		if err != nil {
			t.Fatal(err)
		}
		images := filepath.Join(dir, "images") // made by the producer
		files := map[string][]byte{
			"pages-1.img":   content(1, 12<<20+5), // past writebackStep
			"pages-2.img":   content(2, 3<<20+1),
			"late.img":      content(3, 2<<20+17),
			"empty.img":     nil,
			"inventory.img": content(4, 1000),
		}
		fl := follow(t.Context(), images, followOptions{least: least})
		var wg sync.WaitGroup
		time.Sleep(5 * time.Millisecond) // the follower waits for the directory
		if err := os.Mkdir(images, 0o700); err != nil {
			t.Fatal(err)
		}
		for i, name := range []string{"pages-1.img", "pages-2.img", "empty.img"} {
			wg.Go(func() { appendSlowly(t, filepath.Join(images, name), files[name], uint64(i)) })
		}
		wg.Go(func() {
			// Appears after the others, and is followed while it grows.
			time.Sleep(60 * time.Millisecond)
			p, b := filepath.Join(images, "late.img"), files["late.img"]
			appendSlowly(t, p, b[:followMin], 9)
			waitFollowed(t, fl, "late.img")
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if _, err := f.Write(b[followMin:]); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		// Followed, or (inventory.img, written just before the producer
		// returns) maybe followed. The scanner may be late on a loaded
		// machine: the producer returns once it has found them.
		must := []string{"pages-1.img", "pages-2.img", "late.img"}
		if least == 0 {
			must = append(must, "empty.img")
		}
		for _, name := range must {
			waitFollowed(t, fl, name)
		}
		appendSlowly(t, filepath.Join(images, "inventory.img"), files["inventory.img"], 10)
		known, fst := fl.finish()

		for _, name := range must {
			if _, ok := known[name]; !ok {
				t.Errorf("least %d: %s not followed", least, name)
			}
		}
		for name, k := range known {
			b, ok := files[name]
			switch {
			case !ok || int64(len(b)) < least:
				t.Errorf("least %d: %s followed", least, name)
			case k.Address != record.Sum(b) || k.Size != int64(len(b)):
				t.Errorf("least %d: %s: %d bytes at %s, want %d at %s", least, name, k.Size, k.Address, len(b), record.Sum(b))
			}
		}
		if fst.Files != len(known) || fst.Early > fst.Bytes {
			t.Errorf("least %d: stats %+v", least, fst)
		}
		got, _, err := st.IngestHashed(t.Context(), images, known)
		if err != nil {
			t.Fatal(err)
		}
		if w := plainIngest(t, st, files); got != w {
			t.Errorf("least %d: directory %s, want %s", least, got, w)
		}
	}
}

// plainIngest ingests files, written at once, without following them.
func plainIngest(t testing.TB, st *store.Store, files map[string][]byte) record.Address {
	t.Helper()
	dir, err := st.StagingDir("plain")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, _, err := st.Ingest(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A file changed after the follower hashed it to its end — rewritten in
// place, shrunk, or replaced — is given up while the producer runs, and
// the ingest hashes it: the directory holds its final bytes.
func TestFollowRewritten(t *testing.T) {
	st := mustStore(t)
	for _, c := range []struct {
		name    string
		rewrite func(p string, b []byte) error
		reason  string // the follower's, as a regular expression
	}{
		{"in place", func(p string, b []byte) error {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt(b[:4096], 1<<20)
			return err
		}, "^changed at 2097152 bytes without growing$"},
		{"shrunk", func(p string, b []byte) error {
			return os.Truncate(p, 1<<20)
		}, "^shrank from 2097152 bytes to 1048576$"},
		{"truncated and rewritten", func(p string, b []byte) error {
			return os.WriteFile(p, b, 0o600)
		}, "^(shrank from 2097152 bytes to [0-9]+|changed at 2097152 bytes without growing)$"},
		{"replaced", func(p string, b []byte) error {
			if err := os.WriteFile(p+".new", b, 0o600); err != nil {
				return err
			}
			return os.Rename(p+".new", p)
		}, "^replaced$"},
	} {
		name := c.name
		images, err := st.StagingDir("criu")
		if err != nil {
			t.Fatal(err)
		}
		first, second := content(5, 2<<20), content(6, 2<<20)
		fl := follow(t.Context(), images, followOptions{least: followMin})
		p := filepath.Join(images, "pages-1.img")
		appendSlowly(t, p, first, 5)
		appendSlowly(t, filepath.Join(images, "pages-2.img"), content(7, 1<<20), 7)
		waitQuiet(t, fl, "pages-1.img", int64(len(first)))
		waitFollowed(t, fl, "pages-2.img")
		// Past the granularity of file times on any filesystem here.
		time.Sleep(20 * time.Millisecond)
		if err := c.rewrite(p, second); err != nil {
			t.Fatal(err)
		}
		final, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		known, _ := fl.finish()
		if _, ok := known["pages-1.img"]; ok {
			t.Errorf("%s: the follower vouches for a changed file", name)
		}
		if err := fl.files["pages-1.img"].err; err == nil || !regexp.MustCompile(c.reason).MatchString(err.Error()) {
			t.Errorf("%s: given up for %v, want %s", name, err, c.reason)
		}
		if _, ok := known["pages-2.img"]; !ok {
			t.Errorf("%s: the unchanged file was given up too", name)
		}
		a, _, err := st.IngestHashed(t.Context(), images, known)
		if err != nil {
			t.Fatal(err)
		}
		es, err := st.Listing(a)
		if err != nil {
			t.Fatal(err)
		}
		if es[0].Name != "pages-1.img" || es[0].Address != record.Sum(final) {
			t.Errorf("%s: stored %s %s, want the final bytes, %s", name, es[0].Name, es[0].Address, record.Sum(final))
		}
		if err := st.VerifyDir(t.Context(), a); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A follower stopped while its producer still writes (a failed dump)
// ends its goroutines: the directory can go.
func TestFollowStop(t *testing.T) {
	images := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	fl := follow(ctx, images, followOptions{})
	f, err := os.Create(filepath.Join(images, "pages-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			default:
			}
			f.Write(bytes.Repeat([]byte{byte(i)}, 4096))
			time.Sleep(100 * time.Microsecond)
		}
	}()
	waitFollowed(t, fl, "pages-1.img")
	fl.stop()
	cancel()
	<-stopped
	if err := os.RemoveAll(images); err != nil {
		t.Fatal(err)
	}
}

func waitFollowed(t *testing.T, fl *follower, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if fl.following(name) {
			return
		}
	}
	t.Fatalf("%s: not followed", name)
}

// A later chunked park's pages files are followed without their
// writeback and without a hash of them whole (followOptions.later): their
// chunks are mostly held already, so the staged file is removed, and a
// writeback started would make its removal wait for the disk. Every other
// file's writeback is started, and it is hashed whole.
func TestFollowLater(t *testing.T) {
	st := mustStore(t)
	images := imagesDir(t, st)
	var mu sync.Mutex
	started := map[string]int{}
	defer func(f func(*os.File, int64, int64)) { writeback = f }(writeback)
	writeback = func(f *os.File, off, n int64) {
		mu.Lock()
		started[filepath.Base(f.Name())]++
		mu.Unlock()
	}
	files := map[string][]byte{
		"pages-1.img": content(1, 2*writebackStep+5),
		"other.img":   content(2, 2*writebackStep+7),
	}
	fl := follow(t.Context(), images, followOptions{least: followMin, later: isPages})
	var wg sync.WaitGroup
	for i, name := range []string{"pages-1.img", "other.img"} {
		wg.Go(func() { appendSlowly(t, filepath.Join(images, name), files[name], uint64(i)) })
	}
	wg.Wait()
	waitQuiet(t, fl, "pages-1.img", int64(len(files["pages-1.img"])))
	waitQuiet(t, fl, "other.img", int64(len(files["other.img"])))
	known, _ := fl.finish()
	if k, ok := known["pages-1.img"]; ok {
		t.Errorf("pages-1.img: vouched for whole as %+v", k)
	}
	if k, ok := known["other.img"]; !ok || k.Address != record.Sum(files["other.img"]) {
		t.Errorf("other.img: hashed %+v, want %s", k, record.Sum(files["other.img"]))
	}
	mu.Lock()
	defer mu.Unlock()
	if started["pages-1.img"] != 0 || started["other.img"] == 0 {
		t.Errorf("writebacks started: %v; want none of pages-1.img's, some of other.img's", started)
	}
}
