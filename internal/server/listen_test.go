package server

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "run", "api.sock")
	l, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	if _, err := Listen(p); err == nil {
		t.Fatal("second daemon on a live socket")
	}
	// A stale socket: a listener whose socket file outlives it.
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	l.Close()
	l2, err := Listen(p)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	l2.Close()

	f := filepath.Join(dir, "file")
	os.WriteFile(f, []byte("keep"), 0o644)
	if _, err := Listen(f); !errors.Is(err, ErrNotSocket) {
		t.Fatalf("regular file: %v", err)
	}
	if b, _ := os.ReadFile(f); string(b) != "keep" {
		t.Fatal("a regular file at the socket path was touched")
	}
}
