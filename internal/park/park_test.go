package park

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// producer is a [Checkpointer] whose checkpoint writes its image files
// and rw layer as the executor has CRIU write them: into the image
// directory, each file appended in pieces with pauses.
type producer struct {
	t      testing.TB
	images map[string][]byte
	rootfs []byte
	fail   error // returned after writing, as a dump that failed late

	mu     sync.Mutex
	thawed int
}

func (p *producer) Checkpoint(ctx context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error) {
	if err := os.MkdirAll(cp.ImageDir, 0o700); err != nil {
		return executor.CheckpointStats{}, err
	}
	seed := uint64(20)
	for name, b := range p.images {
		seed++
		appendSlowly(p.t, filepath.Join(cp.ImageDir, name), b, seed)
	}
	if err := os.WriteFile(cp.Rootfs, p.rootfs, 0o600); err != nil {
		return executor.CheckpointStats{}, err
	}
	return executor.CheckpointStats{}, p.fail
}

func (p *producer) Settle(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.thawed++
	return nil
}

// An image park's snapshot is the one a plain ingest of the same trees
// gives, with the memory image hashed while it was written.
func TestImage(t *testing.T) {
	st := mustStore(t)
	p := &producer{
		t: t,
		images: map[string][]byte{
			"pages-1.img":     content(11, 9<<20+3),
			"pagemap-1.img":   content(12, 2000),
			"core-1.img":      content(13, 300),
			"inventory.img":   content(14, 40),
			"empty-files.img": nil,
		},
		rootfs: content(15, 10240),
	}
	res, err := Image(t.Context(), st, p, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mem := plainIngest(t, st, p.images)
	root := plainIngest(t, st, map[string][]byte{RootfsName: p.rootfs})
	if want := record.ImageSnapshot(root, &mem); !res.Snapshot.Equal(want) {
		t.Fatalf("snapshot %s, want %s", res.Snapshot, want)
	}
	if res.Followed > int64(len(p.images["pages-1.img"])) {
		t.Errorf("followed %d bytes", res.Followed)
	}
	if off, err := Offered(t.Context(), st, res.Snapshot); err != nil || !off.Equal(res.Snapshot) {
		t.Fatalf("offered %s, %v", off, err)
	}
	if n, err := Retained(st, res.Snapshot); err != nil || n != res.Retained {
		t.Fatalf("retained %d, reported %d (%v)", n, res.Retained, err)
	}
	if p.thawed != 0 {
		t.Fatal("a good park thawed the unit")
	}
	mustNoStaging(t, st.Dir())
}

// A checkpoint that fails after writing thaws the unit and leaves no
// staging behind; the follower is stopped with it.
func TestImageFails(t *testing.T) {
	st := mustStore(t)
	boom := errors.New("dump failed")
	p := &producer{t: t, images: map[string][]byte{"pages-1.img": content(16, 3<<20)}, fail: boom}
	if _, err := Image(t.Context(), st, p, ImageOptions{}); !errors.Is(err, boom) {
		t.Fatalf("park: %v", err)
	}
	if p.thawed != 1 {
		t.Fatalf("thawed %d times", p.thawed)
	}
	mustNoStaging(t, st.Dir())
}

func mustNoStaging(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "objects", "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left in staging: %s", e.Name())
	}
}

// Layout lays an image park's trees out as links to the stored objects
// (store.Materialize, without hashing again). Offered, the store's Rehash,
// finds the snapshot intact, and after a byte written through one of those
// links a different one: a mismatch to report, not an error. A transcript
// snapshot is rehashed likewise.
func TestOfferedAndLayout(t *testing.T) {
	st := mustStore(t)
	images := map[string][]byte{"pages-1.img": content(31, 2<<20+5), "core-1.img": content(32, 300)}
	rootfs := content(33, 4096)
	mem := plainIngest(t, st, images)
	root := plainIngest(t, st, map[string][]byte{RootfsName: rootfs})
	snap := record.ImageSnapshot(root, &mem)
	if off, err := Offered(t.Context(), st, snap); err != nil || !off.Equal(snap) {
		t.Fatalf("offered %s, %v", off, err)
	}

	dir := filepath.Join(t.TempDir(), "restore", "r1")
	trees, err := Layout(st, snap, dir)
	if err != nil {
		t.Fatal(err)
	}
	if trees.ImageDir != filepath.Join(dir, "images") || trees.Rootfs != filepath.Join(dir, "root", RootfsName) {
		t.Fatalf("trees %+v", trees)
	}
	for name, b := range images {
		if got, err := os.ReadFile(filepath.Join(trees.ImageDir, name)); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s: %d bytes, %v", name, len(got), err)
		}
	}
	if got, err := os.ReadFile(trees.Rootfs); err != nil || !bytes.Equal(got, rootfs) {
		t.Fatalf("rootfs: %d bytes, %v", len(got), err)
	}
	// Not a copy: the layout's files are the objects.
	info, err := os.Stat(trees.Rootfs)
	if err != nil || info.Sys().(*syscall.Stat_t).Nlink < 2 {
		t.Fatalf("rootfs is not a link to its object: %v", err)
	}

	// A byte written through the link is a byte of the stored object.
	pages := filepath.Join(trees.ImageDir, "pages-1.img")
	if err := os.Chmod(pages, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(pages, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^images["pages-1.img"][1<<20]}, 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	off, err := Offered(t.Context(), st, snap)
	if err != nil || off.Equal(snap) || *off.Root != root || *off.Memory == mem {
		t.Fatalf("offered %s after an edit, %v", off, err)
	}
	// Layout does not hash again: that was Offered's to find.
	if _, err := Layout(st, snap, filepath.Join(t.TempDir(), "again")); err != nil {
		t.Fatal(err)
	}
	if _, err := Layout(st, snap, dir); err == nil {
		t.Fatal("a layout over an existing one")
	}

	// A transcript snapshot, intact and missing.
	ta, err := st.PutBytes([]byte("transcript"))
	if err != nil {
		t.Fatal(err)
	}
	ts := record.TranscriptSnapshot(ta)
	if off, err := Offered(t.Context(), st, ts); err != nil || !off.Equal(ts) {
		t.Fatalf("offered transcript %s, %v", off, err)
	}
	gone := record.TranscriptSnapshot(record.Sum([]byte("gone")))
	if _, err := Offered(t.Context(), st, gone); !errors.Is(err, store.ErrMissingObject) {
		t.Fatalf("offered missing transcript: %v", err)
	}
	if _, err := Layout(st, ts, filepath.Join(t.TempDir(), "t")); err == nil {
		t.Fatal("a transcript laid out")
	}
}
