//go:build linux

package executor

import (
	"fmt"
	"os"
	"strings"

	"github.com/containerd/continuity/fs"
)

// The decision of the rw layer's fast path, apart from the filesystem:
// which changes an overlayfs upper directory's entries make, or why the
// fast path cannot express them. scanUpper (rwlayer_scan.go) walks the
// directory and feeds each entry to an overlayDiff.

// upperChange is one entry of the layer, as continuity's fs.ChangeFunc takes it.
type upperChange struct {
	kind fs.ChangeKind
	path string // absolute within the snapshot: "/etc/passwd"
	fi   os.FileInfo
}

// upperEntry is what overlayDiff needs of one entry of an upper directory.
type upperEntry struct {
	path string      // absolute within the snapshot: "/etc/passwd"
	mode os.FileMode // its type and permissions
	rdev uint64      // its device number (a device's)
	// xattrs are its xattrs in listing order; only the overlay ones
	// (under overlayDiff.prefix) need a value.
	xattrs []xattr
	fi     os.FileInfo // carried into the change as it is
}

type xattr struct {
	name  string
	value []byte
}

// overlayXattrs are the overlayfs xattrs an upper directory may carry that
// do not change what its entries mean for the layer: origin (the lower
// inode a copy-up came from), impure (a directory holding copy-ups),
// uuid (of the upper layer), protattr (immutable or append-only flags,
// which a layer does not carry either way), and opaque, checked apart.
var overlayXattrs = map[string]bool{"opaque": true, "origin": true, "impure": true, "uuid": true, "protattr": true}

// maxUpperEntries bounds what an overlayDiff holds in memory.
const maxUpperEntries = 1 << 16

// overlayDiff turns the entries of an upper directory, given in lexical
// order (as continuity's DiffDirChanges walks), into the layer's changes:
// whiteouts (character devices 0:0) as deletions, opaque directories with
// the opaque marker's deletion after them, everything else as additions.
// An overlay xattr outside overlayXattrs (redirect, metacopy, nlink,
// whiteout, …), an opaque value other than "y" or on a non-directory, and
// an entry past maxUpperEntries changes fail it with errNoUpperDir.
type overlayDiff struct {
	prefix  string // of overlayfs's own xattrs: "trusted.overlay." or "user.overlay."
	changes []upperChange
}

// add takes the next entry of the upper directory.
func (d *overlayDiff) add(e upperEntry) error {
	if len(d.changes) >= maxUpperEntries {
		return fmt.Errorf("%w: more than %d entries", errNoUpperDir, maxUpperEntries)
	}
	if e.mode&os.ModeCharDevice != 0 && e.rdev == 0 {
		d.changes = append(d.changes, upperChange{kind: fs.ChangeKindDelete, path: e.path})
		return nil
	}
	opaque := false
	for _, x := range e.xattrs {
		what, ok := strings.CutPrefix(x.name, d.prefix)
		if !ok {
			continue
		}
		if !overlayXattrs[what] {
			return fmt.Errorf("%w: %s has xattr %s", errNoUpperDir, e.path, x.name)
		}
		if what != "opaque" {
			continue
		}
		if string(x.value) != "y" || !e.mode.IsDir() {
			return fmt.Errorf("%w: %s has xattr %s=%q", errNoUpperDir, e.path, x.name, x.value)
		}
		opaque = true
	}
	d.changes = append(d.changes, upperChange{kind: fs.ChangeKindAdd, path: e.path, fi: e.fi})
	if opaque {
		// ChangeWriter turns the deletion of .wh..opq into the
		// opaque marker .wh..wh..opq, as DiffDirChanges has it.
		d.changes = append(d.changes, upperChange{kind: fs.ChangeKindDelete, path: e.path + "/.wh..opq"})
	}
	return nil
}
