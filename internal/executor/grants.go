package executor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/idmap"
)

// A read-only grant of a host directory reaches the sandbox through a
// read-only overlay of it, made by the executor under
// StateDir/grants/<sandbox>/<n> and bind-mounted into the sandbox:
//
//   - connect(2) on a unix socket finds the socket by the inode it was
//     bound to, and a file seen through an overlay has the overlay's
//     inode, so no socket below a granted directory can be connected to
//     (a bind mount, even read-only, leaves every one reachable to a unit
//     that is root);
//   - an overlay shows one file system: a mount the host has below the
//     granted directory is not in the sandbox at all (its mount point
//     shows as the directory beneath it), so nothing below a grant is
//     writable or reaches another file system;
//   - with no upper layer the overlay is read-only whatever the unit does.
//
// To runc and CRIU the grant is a bind mount like any other (external to
// a checkpoint); a restore makes the overlay again for its new sandbox.
// A grant of a regular file, and the daemon's own mounts (Own), are bound
// as they are.
//
// In a sandbox with a user namespace every mount is seen with the run's
// ids: what the host's file system holds as id n, the sandbox sees as its
// own n (host root's files as its root's). Each source is mounted
// idmapped to the range (idmappedBind) under StateDir/grants/<sandbox>:
// a directory grant as the overlay's lower layer (detached once the
// overlay holds it), a file grant and the daemon's own mounts as the
// mount runc binds. The directories above are searchable by all: runc
// mounts them as the range's root.

// grantsDir is where sandbox id's grant overlays are mounted.
func (c *Client) grantsDir(id string) string { return filepath.Join(c.cfg.StateDir, "grants", id) }

// overlayGrants returns spec's mounts with every read-only grant of a
// directory replaced by a read-only overlay of it, mounted now, and, with
// a user namespace's range r, every mount seen through an idmapped mount
// to r. On error nothing is left mounted.
func (c *Client) overlayGrants(id string, mounts []Mount, r *idmap.Range) (_ []Mount, retErr error) {
	out := make([]Mount, len(mounts))
	copy(out, mounts)
	dir := c.grantsDir(id)
	defer func() {
		if retErr != nil {
			_ = removeTree(dir)
		}
	}()
	empty := filepath.Join(c.cfg.StateDir, "grants", ".empty")
	if err := os.MkdirAll(empty, 0o555); err != nil {
		return nil, err
	}
	var userns *os.File
	defer func() {
		if userns != nil {
			userns.Close()
		}
	}()
	if r != nil && len(mounts) > 0 {
		var err error
		if userns, err = rangeUserns(*r); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		for _, d := range []string{filepath.Dir(dir), dir} {
			if err := Searchable(d); err != nil {
				return nil, err
			}
		}
	}
	for i, m := range mounts {
		src, err := filepath.EvalSymlinks(m.Source)
		if err != nil {
			return nil, fmt.Errorf("%w: mount source %s: %w", ErrInvalid, m.Source, err)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return nil, fmt.Errorf("%w: mount source %s: %w", ErrInvalid, m.Source, err)
		}
		target := filepath.Join(dir, strconv.Itoa(i))
		if m.Own || m.Writable || !fi.IsDir() {
			if userns == nil {
				continue
			}
			if err := mountPoint(target, fi.IsDir()); err != nil {
				return nil, err
			}
			if err := idmappedBind(src, target, userns); err != nil {
				return nil, fmt.Errorf("mount source %s: an idmapped mount of it: %w", m.Source, err)
			}
			out[i].Source = target
			continue
		}
		if strings.ContainsAny(src, ":,\\") {
			return nil, fmt.Errorf("%w: mount source %s: a directory granted read-only may not have ':', ',' or '\\' in its path", ErrInvalid, m.Source)
		}
		if err := os.MkdirAll(target, 0o700); err != nil {
			return nil, err
		}
		lower := src
		if userns != nil {
			lower = target + ".lower"
			if err := mountPoint(lower, true); err != nil {
				return nil, err
			}
			if err := idmappedBind(src, lower, userns); err != nil {
				return nil, fmt.Errorf("mount source %s: an idmapped mount of it: %w", m.Source, err)
			}
		}
		opts := "lowerdir=" + lower + ":" + empty
		if err := unix.Mount("overlay", target, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return nil, fmt.Errorf("mount source %s: a read-only overlay of it: %w", m.Source, err)
		}
		if lower != src {
			// The overlay holds its own clone of the layer.
			if err := unix.Unmount(lower, unix.MNT_DETACH); err != nil {
				return nil, fmt.Errorf("mount source %s: detaching its idmapped layer: %w", m.Source, err)
			}
		}
		out[i].Source = target
	}
	return out, nil
}

// mountPoint makes path, a directory (dir) or an empty file, to mount
// on.
func mountPoint(path string, dir bool) error {
	if dir {
		return os.MkdirAll(path, 0o700)
	}
	return os.WriteFile(path, nil, 0o400)
}

// removeGrants unmounts and removes sandbox id's grant overlays.
func (c *Client) removeGrants(id string) error {
	err := removeTree(c.grantsDir(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
