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

	"golang.org/x/sys/unix"
)

// scanUpper walks the upper directory in lexical order and feeds its
// entries to an overlayDiff, which lists them as changes or refuses them
// with errNoUpperDir.
//
// It holds every change in memory (about half a KiB each), so an upper
// directory of more than maxUpperEntries entries — a unit can make any
// number — is errNoUpperDir too: the diff service streams it instead.
func scanUpper(ctx context.Context, o overlayMount) ([]upperChange, error) {
	d := overlayDiff{prefix: o.xattr}
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
		var e upperEntry
		e, buf, err = readUpperEntry(o, path, fi, buf)
		if err != nil {
			return err
		}
		return d.add(e)
	})
	if err != nil {
		return nil, err
	}
	return d.changes, nil
}

// readUpperEntry reads what overlayDiff needs of the entry at path, fi
// its lstat: its mode, device number and xattrs, the values of the
// overlay ones (under o.xattr). It grows buf as listXattrs does.
func readUpperEntry(o overlayMount, path string, fi os.FileInfo, buf []byte) (upperEntry, []byte, error) {
	e := upperEntry{path: "/" + path[len(o.upper)+1:], mode: fi.Mode(), fi: fi}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return e, buf, fmt.Errorf("rw layer: %s: no stat", e.path)
	}
	e.rdev = st.Rdev
	names, buf, err := listXattrs(path, buf)
	if err != nil {
		return e, buf, fmt.Errorf("rw layer: %w", err)
	}
	for _, name := range names {
		x := xattr{name: name}
		if strings.HasPrefix(name, o.xattr) {
			if x.value, err = getXattr(path, name); err != nil {
				return e, buf, fmt.Errorf("rw layer: %w", err)
			}
		}
		e.xattrs = append(e.xattrs, x)
	}
	return e, buf, nil
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
