package park

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// BenchmarkResume is a resume's part of an image park: Offered rehashes
// a memory image of one 256 MiB pages file and 2,000 small files and a
// 16 MiB rw layer, then Layout links both trees out.
func BenchmarkResume(b *testing.B) {
	st := mustStore(b)
	images := map[string][]byte{"pages-1.img": content(41, 256<<20)}
	for i := range 2000 {
		images[fmt.Sprintf("core-%d.img", i)] = content(uint64(100+i), 4096)
	}
	mem := plainIngest(b, st, images)
	root := plainIngest(b, st, map[string][]byte{RootfsName: content(42, 16<<20)})
	snap := record.ImageSnapshot(root, &mem)
	b.Run("Offered", func(b *testing.B) {
		for b.Loop() {
			if off, err := Offered(b.Context(), st, snap); err != nil || !off.Equal(snap) {
				b.Fatal(off, err)
			}
		}
	})
	b.Run("Layout", func(b *testing.B) {
		for b.Loop() {
			if _, err := Layout(st, snap, filepath.Join(b.TempDir(), "restore")); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkResumeServed is a served lazy resume's part of an image park
// of 512 MiB (32,768 chunks, every page but the first lazy) and 26 small
// image files, from a warm page cache: Offered is OfferedServed's check,
// Layout LayoutServed's layout and page server manifest alone, Both the
// two, one after the other, as a resume runs them.
func BenchmarkResumeServed(b *testing.B) {
	st := mustStore(b)
	st.SetChunkedImages(true)
	images := lazyImages(content(41, 512<<20))
	for i := range 26 {
		images[fmt.Sprintf("core-%d.img", 100+i)] = content(uint64(100+i), 1000+i*300)
	}
	p := &producer{t: b, images: images, rootfs: content(42, 4096)}
	res, err := Image(b.Context(), st, p, ImageOptions{})
	if err != nil {
		b.Fatal(err)
	}
	snap := res.Snapshot
	offer := func(b *testing.B) {
		if off, err := OfferedServed(b.Context(), st, snap); err != nil || !off.Equal(snap) {
			b.Fatal(off, err)
		}
	}
	dir := b.TempDir()
	layout := func(b *testing.B) {
		d := filepath.Join(dir, "restore")
		if _, m, err := LayoutServed(st, snap, d); err != nil || len(m.Tasks) != 1 {
			b.Fatal(err)
		}
		if err := os.RemoveAll(d); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("Offered", func(b *testing.B) {
		for b.Loop() {
			offer(b)
		}
	})
	b.Run("Layout", func(b *testing.B) {
		for b.Loop() {
			layout(b)
		}
	})
	b.Run("Both", func(b *testing.B) {
		for b.Loop() {
			offer(b)
			layout(b)
		}
	})
}
