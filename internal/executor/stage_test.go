package executor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
)

// A staging refused after its pages were bound (a park made without a
// user namespace has no userns image to put the range in) leaves no
// mount behind: the refused restore's work directory can be removed.
func TestStageRefusedLeavesNoMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: idmapped mounts")
	}
	images, work := t.TempDir(), t.TempDir()
	for name, b := range map[string][]byte{"pages-1.img": make([]byte, 4096), "inventory.img": {1}} {
		if err := os.WriteFile(filepath.Join(images, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := stageImages(images, work, idmap.Range{Base: 1 << 20})
	if !errors.Is(err, criu.ErrRefused) {
		t.Fatalf("staged a park without a userns image: %v", err)
	}
	m, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(m), work) {
		t.Fatalf("a mount is left under %s", work)
	}
	if err := os.RemoveAll(work); err != nil {
		t.Fatal(err)
	}
}
