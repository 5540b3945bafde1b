package host

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
)

// A host whose containerd cannot be reached does not open, and leaves
// nothing open behind it: its store (bbolt holds a lock on it while open)
// opens again at once; its key and audit chain are kept for the next start.
func TestOpenRefusedClosesWhatItOpened(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := Open(ctx, Config{StateDir: dir, ContainerdAddress: filepath.Join(dir, "no-containerd.sock")})
	if err == nil {
		t.Fatal("opened with no containerd")
	}
	st, err := store.Open(filepath.Join(dir, "store")) // ErrLocked if it were still open
	if err != nil {
		t.Fatalf("the store was left open: %v", err)
	}
	st.Close()
	if _, err := os.Stat(filepath.Join(dir, "host.key")); err != nil {
		t.Fatalf("the host key: %v", err)
	}
}
