package executor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFileWhole (internal/atomicfile) writes the whole stream, mode 0600,
// durably or not, and returns its size; a stream over its budget leaves
// neither the file nor a temporary one, and ErrTooLarge comes through.
func TestWriteFileWhole(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rootfs.tar")
	for _, durable := range []bool{false, true} {
		want := strings.Repeat("x", 3<<20+5)
		n, err := writeFileWhole(p, strings.NewReader(want), durable)
		if err != nil || n != int64(len(want)) {
			t.Fatalf("durable %v: %d bytes, %v", durable, n, err)
		}
		if b, _ := os.ReadFile(p); string(b) != want {
			t.Fatalf("durable %v: %d bytes on disk", durable, len(b))
		}
		if info, _ := os.Stat(p); info.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v", info.Mode())
		}
		os.Remove(p)
	}
	if _, err := writeFileWhole(p, budgeted(strings.NewReader(strings.Repeat("y", 10000)), 9999), false); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over budget: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}
