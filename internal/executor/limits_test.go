//go:build linux

package executor

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
)

// TestBudgeted: a layer of exactly its budget passes; one byte more fails
// with ErrTooLarge, having passed on no more than the budget.
func TestBudgeted(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 10000)
	var out bytes.Buffer
	if n, err := io.Copy(&out, budgeted(bytes.NewReader(data), 10000)); err != nil || n != 10000 {
		t.Fatalf("at the budget: %d, %v", n, err)
	}
	out.Reset()
	_, err := io.Copy(&out, budgeted(bytes.NewReader(data), 9999))
	if !errors.Is(err, ErrTooLarge) || out.Len() > 9999 {
		t.Fatalf("one byte over: %v, %d bytes passed", err, out.Len())
	}
}

// TestLayerBoundSparse: a sparse file counts at its logical size, and the
// walk stops once past the budget.
func TestLayerBoundSparse(t *testing.T) {
	upper := t.TempDir()
	f, err := os.Create(filepath.Join(upper, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(upper, "small"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	mounts := []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"workdir=/w", "upperdir=" + upper, "lowerdir=/l"}}}
	n, err := layerBound(context.Background(), mounts, 1<<50)
	if err != nil || n < 1<<40 {
		t.Fatalf("bound %d (%v), want at least 1 TiB", n, err)
	}
	if n, err := layerBound(context.Background(), mounts, 1<<20); err != nil || n <= 1<<20 {
		t.Fatalf("bound under a 1 MiB budget: %d (%v), want over it", n, err)
	}
	if err := os.Remove(filepath.Join(upper, "sparse")); err != nil {
		t.Fatal(err)
	}
	if n, err := layerBound(context.Background(), mounts, 1<<20); err != nil || n > 8<<10 {
		t.Fatalf("bound of one small file: %d (%v)", n, err)
	}
	if _, err := layerBound(context.Background(), []mount.Mount{{Type: "fuse", Source: "x"}}, 1<<20); err == nil {
		t.Fatal("measured a snapshot it cannot read")
	}
}

// TestCappedOutput: a stream stops at its cap, says so once, counts what
// it dropped, and a file reopened at its cap stays there without a second
// note.
func TestCappedOutput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stderr")
	open := func() *capped {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		w, err := newCapped(f, "stderr", 10, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w := open()
	for _, s := range []string{"0123", "456789ab", "cdef"} {
		if n, err := w.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("write %q: %d, %v", s, n, err)
		}
	}
	want := "0123456789" + capNote("stderr", 10)
	if b, _ := os.ReadFile(path); string(b) != want {
		t.Fatalf("file %q, want %q", b, want)
	}
	if got := w.omitted.Load(); got != 6 {
		t.Fatalf("omitted %d, want 6", got)
	}
	w = open()
	if _, err := w.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != want || strings.Count(string(b), "runrecordd:") != 1 {
		t.Fatalf("reopened at its cap: file %q", b)
	}
}
