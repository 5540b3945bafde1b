//go:build linux

package secrets

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

func mustHost(t *testing.T) *Values {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root (CI runs as root)")
	}
	state := t.TempDir()
	h := New(state)
	t.Cleanup(func() {
		for h.mounted() {
			if err := unix.Unmount(h.dir, unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
		}
	})
	return h
}

func TestPutMissingRemove(t *testing.T) {
	h := mustHost(t)
	names := []string{"A", "b.c"}
	if got := h.Missing("r-1", names); !slices.Equal(got, names) {
		t.Fatalf("before any put: missing %q", got)
	}
	if _, err := os.Stat(h.dir); err == nil {
		t.Fatalf("%s made before a value was put", h.dir)
	}
	if err := h.Put("r-1", map[string]string{"A": "one", "b.c": ""}); err != nil {
		t.Fatal(err)
	}
	if !h.mounted() {
		t.Fatal("values put with no tmpfs mounted")
	}
	if got := h.Missing("r-1", names); got != nil {
		t.Fatalf("missing %q", got)
	}
	d, _ := h.Dir("r-1")
	b, err := os.ReadFile(filepath.Join(d, "A"))
	fi, _ := os.Stat(filepath.Join(d, "A"))
	if err != nil || string(b) != "one" || fi.Mode().Perm() != 0o400 {
		t.Fatalf("A: %q %v %v", b, fi.Mode(), err)
	}
	// A put replaces the values, and drops the names it does not give.
	if err := h.Put("r-1", map[string]string{"A": "two"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(d, "A")); string(b) != "two" {
		t.Fatalf("A after a second put: %q", b)
	}
	if got := h.Missing("r-1", names); !slices.Equal(got, []string{"b.c"}) {
		t.Fatalf("missing %q", got)
	}
	if runs, err := h.Runs(); err != nil || !slices.Equal(runs, []string{"r-1"}) {
		t.Fatalf("runs %q %v", runs, err)
	}
	if err := h.Remove("r-1"); err != nil {
		t.Fatal(err)
	}
	if got := h.Missing("r-1", names); !slices.Equal(got, names) {
		t.Fatalf("after remove: missing %q", got)
	}
	// With the tmpfs gone (a reboot), nothing is held and the bare
	// directory holds nothing.
	if err := h.Put("r-2", map[string]string{"A": "x"}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(h.dir, 0); err != nil {
		t.Fatal(err)
	}
	if got := h.Missing("r-2", []string{"A"}); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("after the tmpfs went: missing %q", got)
	}
	if es, _ := os.ReadDir(h.dir); len(es) != 0 {
		t.Fatalf("the disk under the tmpfs holds %v", es)
	}
	if _, err := h.runDir("../x"); !errors.Is(err, unit.ErrInvalid) {
		t.Fatalf("run ../x: %v", err)
	}
}

func TestNames(t *testing.T) {
	names := []string{"A", "B"}
	if err := Names(names, map[string]string{"A": "1", "B": "2"}); err != nil {
		t.Fatal(err)
	}
	err := Names(names, map[string]string{"A": "hunter2"})
	if !errors.Is(err, ErrRequired) || !strings.Contains(err.Error(), "B") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("B missing: %v", err)
	}
	if err := Names(names, map[string]string{"A": "1", "B": "2", "C": "hunter2"}); !errors.Is(err, unit.ErrInvalid) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("C extra: %v", err)
	}
	if err := Names(names, map[string]string{"A": "1", "B": strings.Repeat("x", MaxValue+1)}); !errors.Is(err, unit.ErrInvalid) {
		t.Fatalf("B too long: %v", err)
	}
	if err := Names(nil, nil); err != nil {
		t.Fatal(err)
	}
}

// A put that finds the tmpfs full is refused ErrNoSpace and changes
// nothing: the values held stay, whole, and no part of a new one is left.
func TestPutNoSpace(t *testing.T) {
	h := mustHost(t)
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A tmpfs of 16 pages stands for the full 256 MiB one.
	if err := unix.Mount("tmpfs", h.dir, "tmpfs", 0, "mode=0700,size=64k"); err != nil {
		t.Fatal(err)
	}
	old := map[string]string{"A": "one", "B": "two"}
	if err := h.Put("r", old); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", MaxValue)
	err := h.Put("r", map[string]string{"A": big, "B": big})
	if !errors.Is(err, ErrNoSpace) || strings.Contains(err.Error(), big) {
		t.Fatalf("a put over the tmpfs's size: %v", err)
	}
	d, _ := h.Dir("r")
	es, _ := os.ReadDir(d)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"A", "B"}) {
		t.Fatalf("after the refused put the run's directory holds %q", names)
	}
	for n, v := range old {
		if b, err := os.ReadFile(filepath.Join(d, n)); err != nil || string(b) != v {
			t.Fatalf("%s after the refused put: %q %v", n, b, err)
		}
	}
	// A new run's first put, refused the same way, leaves no value.
	if err := h.Put("s", map[string]string{"A": big, "B": big}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a new run's put over the tmpfs's size: %v", err)
	}
	if got := h.Missing("s", []string{"A", "B"}); len(got) != 2 {
		t.Fatalf("after the refused put, run s misses only %q", got)
	}
}

// A secret may be named as another's value is staged in a put (".new-x"
// beside "x"): each still holds its own value after a put, whichever
// order the put writes them in.
func TestPutNamesApartFromStaging(t *testing.T) {
	h := mustHost(t)
	values := map[string]string{".new-x": "staged-looking", "x": "plain"}
	for range 20 { // a map's order varies: both orders are met
		if err := h.Put("r-1", values); err != nil {
			t.Fatal(err)
		}
		d, _ := h.Dir("r-1")
		for n, v := range values {
			if b, err := os.ReadFile(filepath.Join(d, n)); err != nil || string(b) != v {
				t.Fatalf("%s: %q, %v; want %q", n, b, err, v)
			}
		}
	}
}
