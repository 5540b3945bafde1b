//go:build linux

// The tests of the rw layer's fast path that need no containerd: its
// refusals. Those against real containerd are in rwlayer_sandbox_test.go
// (package executor_test, with export_test.go's access).

package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"golang.org/x/sys/unix"
)

// wantNoUpperDir runs writeOverlayDiff and writeOverlayDiffFile on mounts
// and wants errNoUpperDir from both, with nothing written.
func wantNoUpperDir(t *testing.T, mounts []mount.Mount) {
	t.Helper()
	var buf bytes.Buffer
	err := writeOverlayDiff(context.Background(), mounts, &buf)
	if !errors.Is(err, errNoUpperDir) {
		t.Fatalf("writeOverlayDiff: %v, want errNoUpperDir", err)
	}
	if buf.Len() != 0 {
		t.Fatalf("writeOverlayDiff wrote %d bytes before failing", buf.Len())
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "rootfs.tar")
	if _, err := writeOverlayDiffFile(context.Background(), mounts, path, 1<<62); !errors.Is(err, errNoUpperDir) {
		t.Fatalf("writeOverlayDiffFile: %v, want errNoUpperDir", err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("writeOverlayDiffFile left %v (%v)", ents, err)
	}
	t.Logf("%v", err)
}

// TestRwLayerOverlayMountsRefused: mount lists the fast path does not take.
func TestRwLayerOverlayMountsRefused(t *testing.T) {
	upper, work, lower := t.TempDir(), t.TempDir(), t.TempDir()
	ok := []string{"index=off", "workdir=" + work, "upperdir=" + upper, "lowerdir=" + lower}
	for _, tc := range []struct {
		name   string
		mounts []mount.Mount
	}{
		{"none", nil},
		{"bind", []mount.Mount{{Type: "bind", Source: upper, Options: []string{"rbind", "rw"}}}},
		{"two", []mount.Mount{{Type: "overlay", Source: "overlay", Options: ok}, {Type: "bind", Source: lower}}},
		{"fuse", []mount.Mount{{Type: "fuse3.fuse-overlayfs", Source: "overlay", Options: ok}}},
		{"view", []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=" + lower + ":" + upper}}}},
		{"no lowerdir", []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"workdir=" + work, "upperdir=" + upper}}}},
		{"relative upperdir", []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"upperdir=up", "lowerdir=" + lower}}}},
		{"index", []mount.Mount{{Type: "overlay", Source: "overlay", Options: append(ok, "index=on")}}},
		{"index joined", []mount.Mount{{Type: "overlay", Source: "overlay", Options: append(ok, "xino=off,index=on")}}},
		{"nfs_export", []mount.Mount{{Type: "overlay", Source: "overlay", Options: append(ok, "nfs_export=on")}}},
		{"metacopy", []mount.Mount{{Type: "overlay", Source: "overlay", Options: append(ok, "metacopy=on")}}},
	} {
		t.Run(tc.name, func(t *testing.T) { wantNoUpperDir(t, tc.mounts) })
	}
	// The last index option wins, as in the kernel.
	mounts := []mount.Mount{{Type: "overlay", Source: "overlay", Options: append([]string{"index=on"}, ok...)}}
	if err := writeOverlayDiff(context.Background(), mounts, new(bytes.Buffer)); err != nil {
		t.Fatalf("index=on then index=off: %v", err)
	}
}

// privilegedHere skips as executor_test's privileged does (this package
// cannot see it).
func privilegedHere(t *testing.T) {
	t.Helper()
	if os.Getenv("RUNRECORDD_SKIP_PRIVILEGED") == "1" {
		t.Skip("RUNRECORDD_SKIP_PRIVILEGED=1")
	}
}

// handOverlay mounts an overlay of a new lower directory, which fill
// populates, with extra mount options, and returns the merged directory
// and the mounts as a snapshotter would give them (without the extra
// options: what the kernel would default to).
func handOverlay(t *testing.T, extra string, fill func(lower string)) (string, []mount.Mount) {
	t.Helper()
	dir := t.TempDir()
	lower, upper, work, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{lower, upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fill(lower)
	opts := []string{"index=off", "workdir=" + work, "upperdir=" + upper, "lowerdir=" + lower}
	data := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",index=off," + extra
	if err := unix.Mount("overlay", merged, "overlay", 0, data); err != nil {
		t.Fatalf("mount overlay %s: %v", data, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, 0); err != nil {
			t.Error(err)
		}
	})
	return merged, []mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}
}

// TestRwLayerOverlayRedirectRefused: a lower directory renamed on a mount
// with redirect_dir=on leaves an upper directory whose content is still in
// the lower layer, under another name: the fast path refuses it.
func TestRwLayerOverlayRedirectRefused(t *testing.T) {
	privilegedHere(t)
	merged, mounts := handOverlay(t, "redirect_dir=on", func(lower string) {
		if err := os.MkdirAll(filepath.Join(lower, "d", "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(lower, "d", "sub", "f"), []byte("f"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	// Before the rename the same mount is fine.
	if err := writeOverlayDiff(context.Background(), mounts, new(bytes.Buffer)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(merged, "d"), filepath.Join(merged, "e")); err != nil {
		t.Fatal(err)
	}
	wantNoUpperDir(t, mounts)
}

// TestRwLayerOverlayMetacopyRefused: a chmod on a mount with metacopy=on
// copies up only the metadata; the data stays in the lower layer. The
// mount list says nothing of metacopy (as when the kernel defaults to it):
// the scan finds the xattr.
func TestRwLayerOverlayMetacopyRefused(t *testing.T) {
	privilegedHere(t)
	merged, mounts := handOverlay(t, "redirect_dir=on,metacopy=on", func(lower string) {
		if err := os.WriteFile(filepath.Join(lower, "f"), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if err := os.Chmod(filepath.Join(merged, "f"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantNoUpperDir(t, mounts)
}

// TestRwLayerOverlayUnknownXattrRefused: an overlay xattr the conversion
// does not know, and an opaque value other than "y".
func TestRwLayerOverlayUnknownXattrRefused(t *testing.T) {
	privilegedHere(t)
	for _, x := range []struct{ name, value string }{
		{"trusted.overlay.nlink", "U+1"},
		{"trusted.overlay.opaque", "x"},
	} {
		t.Run(x.name+"="+x.value, func(t *testing.T) {
			merged, mounts := handOverlay(t, "", func(string) {})
			if err := os.Mkdir(filepath.Join(merged, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := writeOverlayDiff(context.Background(), mounts, new(bytes.Buffer)); err != nil {
				t.Fatal(err)
			}
			upper := filepath.Join(filepath.Dir(merged), "upper")
			if err := unix.Lsetxattr(filepath.Join(upper, "d"), x.name, []byte(x.value), 0); err != nil {
				t.Fatal(err)
			}
			wantNoUpperDir(t, mounts)
		})
	}
}

// An upper directory of more entries than the fast path holds in memory
// goes to the diff service: a unit can make any number of files.
func TestRwLayerOverlayTooManyEntries(t *testing.T) {
	upper := t.TempDir()
	for i := range maxUpperEntries + 1 {
		f, err := os.Create(filepath.Join(upper, fmt.Sprintf("f%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	_, err := scanUpper(context.Background(), overlayMount{upper: upper, xattr: "trusted.overlay."})
	if !errors.Is(err, errNoUpperDir) {
		t.Fatalf("scan of %d entries: %v, want errNoUpperDir", maxUpperEntries+1, err)
	}
}
