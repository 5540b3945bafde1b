//go:build linux

package executor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/archive"
	"golang.org/x/sys/unix"
)

// errNoUpperDir says that [writeOverlayDiff] cannot make the rw layer from
// the snapshot's upper directory: its mounts are not one overlay mount with
// an upperdir, the mount or the kernel uses an overlay feature the
// conversion cannot express (index, redirect_dir, metacopy, an overlay
// xattr it does not know), or this process cannot read the trusted.*
// xattrs that mark opaque directories. Nothing has been written; the diff
// service can still make the layer.
var errNoUpperDir = errors.New("executor: rw layer: no upper directory the fast path can express")

// writeOverlayDiff writes to w the OCI image layer (an uncompressed tar,
// deletions as OCI whiteouts) of the changes an overlayfs snapshot holds
// in its upper directory, given the snapshot's mounts as containerd's
// snapshotter returns them (Snapshotter.Mounts(ctx, key)).
//
// Applied over the snapshot's parent (the image), the layer makes the tree
// the snapshot's mount shows, as far as an OCI layer written by containerd's
// archive.ChangeWriter can say it: like the diff service's walking differ
// it keeps only the security.capability xattr, skips sockets, truncates
// mtimes to the second and ignores the root directory's own metadata.
//
// It reads only the upper directory, never the lower layers: the cost is
// in proportion to what changed, not to the image. Every entry of the
// upper directory goes into the layer: overlayfs puts an entry there only
// when it was created, changed or copied up. Whiteouts (character devices
// 0:0) become OCI whiteouts (.wh.name) and opaque directories (the overlay
// opaque xattr "y") an opaque marker (.wh..wh..opq) after the directory's
// own entry; neither needs to know what the lower layers hold, so no view
// of them is mounted.
//
// Where it differs from the diff service: a non-directory the sandbox
// copied up without changing its content, size, mode, owner or mtime (an
// open for writing that wrote nothing, a change of a user xattr) is in
// the upper directory, so it goes into the layer, which the diff service
// leaves it out of. Applied, it keeps its content and metadata, but its
// mtime is at whole seconds and of the image's xattrs on it only
// security.capability is left (the diff service keeps the image's entry
// and so also loses the xattr change).
//
// continuity's fs.DiffDirChanges, which containerd's erofs differ uses
// over the upper directory, is not used: it needs a mounted view of the
// merged lower layers (it stats each upper path there), and with that
// view still (continuity v0.5.0) fails on a file replaced by a non-empty
// directory (ENOTDIR), drops a directory whose only change is its owner
// (it compares size, mode and mtime), and writes the whiteout of a
// deleted dangling symlink as a character device 0:0 (os.Stat follows the
// symlink). The conversion here is its own, without those.
//
// The upper directory is read while the snapshot may be mounted: the
// caller keeps the sandbox frozen or stopped so that it does not change.
// The upper directory is scanned in full before the first byte is written,
// and [errNoUpperDir] is returned, with nothing written, when the layer
// cannot be made this way.
func writeOverlayDiff(ctx context.Context, mounts []mount.Mount, w io.Writer) error {
	o, err := parseOverlay(mounts)
	if err != nil {
		return err
	}
	changes, err := scanUpper(ctx, o)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	cw := archive.NewChangeWriter(bw, o.upper)
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := cw.HandleChange(c.kind, c.path, c.fi, nil); err != nil {
			return fmt.Errorf("rw layer: %s: %w", c.path, err)
		}
	}
	if err := cw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// writeOverlayDiffFile writes the layer of [writeOverlayDiff] to path
// whole (temp file, rename; not synced: see [Checkpoint.Rootfs]) and
// returns its size; past budget bytes it stops with [ErrTooLarge]. On an
// error path is left untouched.
func writeOverlayDiffFile(ctx context.Context, mounts []mount.Mount, path string, budget int64) (int64, error) {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(writeOverlayDiff(ctx, mounts, pw))
	}()
	n, err := writeFileWhole(path, budgeted(pr, budget), false)
	// Unblocks the writer if the copy stopped early (a full disk).
	pr.Close()
	<-done
	return n, err
}

// overlayMount is what writeOverlayDiff needs of a snapshot's overlay
// mount.
type overlayMount struct {
	upper  string   // cleaned
	lowers []string // topmost first
	// xattr is the prefix of overlayfs's own xattrs on the upper
	// directory: "trusted.overlay.", or "user.overlay." for a mount with
	// the userxattr option.
	xattr string
}

// parseOverlay checks that mounts is one overlay mount with an upperdir
// that the fast path can read, and returns its directories.
func parseOverlay(mounts []mount.Mount) (overlayMount, error) {
	var o overlayMount
	if len(mounts) != 1 || mounts[0].Type != "overlay" {
		return o, fmt.Errorf("%w: mounts %s", errNoUpperDir, describeMounts(mounts))
	}
	o.xattr = "trusted.overlay."
	// Mount options are last-wins in the kernel; the defaults of those
	// not given are the overlay module's parameters.
	index, metacopy := "", ""
	for _, opt := range mounts[0].Options {
		// An option string may hold several, comma-joined.
		for _, opt := range strings.Split(opt, ",") {
			key, value, _ := strings.Cut(opt, "=")
			switch key {
			case "upperdir":
				o.upper = filepath.Clean(value)
			case "lowerdir":
				o.lowers = strings.Split(value, ":")
			case "userxattr":
				o.xattr = "user.overlay."
			case "index":
				index = value
			case "nfs_export":
				// nfs_export=on needs, and turns on, the index.
				if value == "on" {
					index = "on"
				}
			case "metacopy":
				metacopy = value
			}
		}
	}
	// The lower directories are not read (see writeOverlayDiff), but an
	// upper directory without them is no overlay mount this reads right.
	if !filepath.IsAbs(o.upper) || len(o.lowers) == 0 || slices.Contains(o.lowers, "") {
		return o, fmt.Errorf("%w: overlay mount %v has no upperdir or no lowerdir", errNoUpperDir, mounts[0].Options)
	}
	// With the index on, copying up one of several hard links to a lower
	// file changes what the others, which stay in the lower layer, show:
	// a change the upper directory does not hold.
	if index == "on" || index == "" && moduleParam("index") {
		return o, fmt.Errorf("%w: overlay index is on", errNoUpperDir)
	}
	// Metadata-only copy-ups leave the data in a lower layer. They carry
	// an xattr the scan also refuses; this only fails sooner.
	if metacopy == "on" {
		return o, fmt.Errorf("%w: overlay metacopy is on", errNoUpperDir)
	}
	// trusted.* xattrs (the opaque marks) are visible only with
	// CAP_SYS_ADMIN: without it opaque directories would pass as ordinary
	// ones.
	if o.xattr == "trusted.overlay." && !hasSysAdmin() {
		return o, fmt.Errorf("%w: no CAP_SYS_ADMIN to read trusted.overlay xattrs", errNoUpperDir)
	}
	fi, err := os.Stat(o.upper)
	if err != nil {
		return o, fmt.Errorf("rw layer: upper directory: %w", err)
	}
	if !fi.IsDir() {
		return o, fmt.Errorf("rw layer: upper directory %s is not a directory", o.upper)
	}
	return o, nil
}

func describeMounts(mounts []mount.Mount) string {
	if len(mounts) == 0 {
		return "(none)"
	}
	types := make([]string, len(mounts))
	for i, m := range mounts {
		types[i] = m.Type
	}
	return strings.Join(types, ", ")
}

// moduleParam reads a boolean parameter of the overlay module: the default
// of the mount option of the same name.
func moduleParam(name string) bool {
	data, err := os.ReadFile("/sys/module/overlay/parameters/" + name)
	return err == nil && bytes.HasPrefix(data, []byte("Y"))
}

// hasSysAdmin says whether this process has CAP_SYS_ADMIN in its effective
// set.
var hasSysAdmin = sync.OnceValue(func() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_ADMIN/32].Effective&(1<<(unix.CAP_SYS_ADMIN%32)) != 0
})
