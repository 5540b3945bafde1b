package park

import (
	"fmt"
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
