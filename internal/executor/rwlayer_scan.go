//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/continuity/fs"
	"golang.org/x/sys/unix"
)

// upperChange is one entry of the layer, as continuity's fs.ChangeFunc takes it.
type upperChange struct {
	kind fs.ChangeKind
	path string // absolute within the snapshot: "/etc/passwd"
	fi   os.FileInfo
}

// overlayXattrs are the overlayfs xattrs an upper directory may carry that
// do not change what its entries mean for the layer: origin (the lower
// inode a copy-up came from), impure (a directory holding copy-ups),
// uuid (of the upper layer), protattr (immutable or append-only flags,
// which a layer does not carry either way), and opaque, checked apart.
var overlayXattrs = map[string]bool{"opaque": true, "origin": true, "impure": true, "uuid": true, "protattr": true}

// maxUpperEntries bounds what scanUpper holds in memory.
const maxUpperEntries = 1 << 16

// scanUpper walks the upper directory in lexical order, as continuity's
// DiffDirChanges does, and lists its entries as changes: whiteouts as
// deletions, opaque directories with the opaque marker's deletion after
// them, everything else as additions. An overlay xattr outside
// overlayXattrs (redirect, metacopy, nlink, whiteout, …) or an opaque
// value other than "y" fails it with errNoUpperDir.
//
// It holds every entry in memory (about half a KiB each), so an upper
// directory of more than maxUpperEntries entries — a unit can make any
// number — is errNoUpperDir too: the diff service streams it instead.
func scanUpper(ctx context.Context, o overlayMount) ([]upperChange, error) {
	var changes []upperChange
	buf := make([]byte, 1024)
	err := filepath.Walk(o.upper, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if path == o.upper {
			return nil
		}
		if len(changes) >= maxUpperEntries {
			return fmt.Errorf("%w: more than %d entries", errNoUpperDir, maxUpperEntries)
		}
		rel := "/" + path[len(o.upper)+1:]
		if isWhiteout(fi) {
			changes = append(changes, upperChange{kind: fs.ChangeKindDelete, path: rel})
			return nil
		}
		var names []string
		names, buf, err = listXattrs(path, buf)
		if err != nil {
			return fmt.Errorf("rw layer: %w", err)
		}
		opaque := false
		for _, name := range names {
			what, ok := strings.CutPrefix(name, o.xattr)
			if !ok {
				continue
			}
			if !overlayXattrs[what] {
				return fmt.Errorf("%w: %s has xattr %s", errNoUpperDir, rel, name)
			}
			if what != "opaque" {
				continue
			}
			v, err := getXattr(path, name)
			if err != nil {
				return fmt.Errorf("rw layer: %w", err)
			}
			if string(v) != "y" || !fi.IsDir() {
				return fmt.Errorf("%w: %s has xattr %s=%q", errNoUpperDir, rel, name, v)
			}
			opaque = true
		}
		changes = append(changes, upperChange{kind: fs.ChangeKindAdd, path: rel, fi: fi})
		if opaque {
			// ChangeWriter turns the deletion of .wh..opq into the
			// opaque marker .wh..wh..opq, as DiffDirChanges has it.
			changes = append(changes, upperChange{kind: fs.ChangeKindDelete, path: rel + "/.wh..opq"})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return changes, nil
}

// isWhiteout says whether fi is an overlayfs whiteout: a character device
// with device number 0:0.
func isWhiteout(fi os.FileInfo) bool {
	if fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

// listXattrs lists the xattr names of path (not following a symlink),
// growing buf as needed.
func listXattrs(path string, buf []byte) ([]string, []byte, error) {
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			size, err := unix.Llistxattr(path, nil)
			if err != nil {
				return nil, buf, &os.PathError{Op: "llistxattr", Path: path, Err: err}
			}
			buf = make([]byte, max(size, 2*len(buf)))
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, buf, nil
		}
		if err != nil {
			return nil, buf, &os.PathError{Op: "llistxattr", Path: path, Err: err}
		}
		if n == 0 {
			return nil, buf, nil
		}
		return strings.Split(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00"), buf, nil
	}
}

func getXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 64)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "lgetxattr " + name, Path: path, Err: err}
		}
		return buf[:n], nil
	}
}
