package executor

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// unmountUnder detaches every mount below dir (not dir itself), deepest
// first. A CRIU killed in the middle of a restore leaves its cgroup yard
// (.criu.cgyard.*, every cgroup hierarchy of the host mounted under its
// work directory) and runc's criu-root behind: removing such a directory
// without this would descend into the host's cgroup trees.
func unmountUnder(dir string) error {
	points, err := mountsBelow(dir)
	if err != nil {
		return err
	}
	// Deepest first; a path mounted twice is detached as often.
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var first error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT && first == nil {
			first = &os.PathError{Op: "unmount", Path: p, Err: err}
		}
	}
	return first
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, ok := octal(s[i+1 : i+4]); ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func octal(s string) (byte, bool) {
	if len(s) != 3 {
		return 0, false
	}
	var v int
	for _, c := range s {
		if c < '0' || c > '7' {
			return 0, false
		}
		v = v*8 + int(c-'0')
	}
	return byte(v), v < 256
}

// removeTree removes dir and everything in it, after detaching every mount
// below it. If a mount is still there, it removes nothing: a CRIU killed
// mid-restore leaves every cgroup hierarchy of the host mounted below its
// work directory, and a plain os.RemoveAll would walk into them.
func removeTree(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	if left, err := mountsBelow(dir); err != nil {
		return err
	} else if len(left) > 0 {
		return fmt.Errorf("not removing %s: %s is still mounted below it", dir, left[0])
	}
	return os.RemoveAll(dir)
}

// mountsBelow lists the mount points below dir.
func mountsBelow(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		fields := strings.Fields(l)
		if len(fields) < 5 {
			continue
		}
		if p := unescapeMountPath(fields[4]); strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	return out, nil
}
