//go:build linux

package executor

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/continuity/fs"
)

// The fast path's decision alone, from entries made up here: no root, no
// overlay mount, no filesystem (run with RUNRECORDD_SKIP_PRIVILEGED=1 as
// any user).

// info is an os.FileInfo that only says which entry it is.
type info string

func (i info) Name() string       { return string(i) }
func (i info) Size() int64        { return 0 }
func (i info) Mode() os.FileMode  { return 0 }
func (i info) ModTime() time.Time { return time.Time{} }
func (i info) IsDir() bool        { return false }
func (i info) Sys() any           { return nil }

const trusted = "trusted.overlay."

func file(path string, xs ...xattr) upperEntry {
	return upperEntry{path: path, mode: 0o644, xattrs: xs, fi: info(path)}
}

func dir(path string, xs ...xattr) upperEntry {
	return upperEntry{path: path, mode: os.ModeDir | 0o755, xattrs: xs, fi: info(path)}
}

func charDev(path string, rdev uint64, xs ...xattr) upperEntry {
	return upperEntry{path: path, mode: os.ModeDevice | os.ModeCharDevice, rdev: rdev, xattrs: xs, fi: info(path)}
}

func x(name, value string) xattr { return xattr{name: name, value: []byte(value)} }

// add and del are the changes wanted: "+/a" and "-/a".
func add(path string) string { return "+" + path }
func del(path string) string { return "-" + path }

func TestOverlayDiff(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prefix  string // trusted when empty
		entries []upperEntry
		want    []string
		refused string // a part of the errNoUpperDir's message
	}{
		{name: "files and directories are added in order",
			entries: []upperEntry{dir("/etc"), file("/etc/passwd"), file("/new")},
			want:    []string{add("/etc"), add("/etc/passwd"), add("/new")}},
		{name: "a character device 0:0 is a whiteout",
			entries: []upperEntry{dir("/etc"), charDev("/etc/shadow", 0)},
			want:    []string{add("/etc"), del("/etc/shadow")}},
		{name: "a whiteout's xattrs do not count",
			entries: []upperEntry{charDev("/gone", 0, x(trusted+"redirect", "/x"))},
			want:    []string{del("/gone")}},
		{name: "a character device other than 0:0 is an entry",
			entries: []upperEntry{charDev("/dev/null", 1<<8|3)},
			want:    []string{add("/dev/null")}},
		{name: "a block device 0:0 is an entry",
			entries: []upperEntry{{path: "/blk", mode: os.ModeDevice, fi: info("/blk")}},
			want:    []string{add("/blk")}},
		{name: "an opaque directory is followed by its marker",
			entries: []upperEntry{dir("/var", x(trusted+"opaque", "y")), file("/var/a")},
			want:    []string{add("/var"), del("/var/.wh..opq"), add("/var/a")}},
		{name: "the xattrs that change nothing",
			entries: []upperEntry{
				file("/a", x(trusted+"origin", "\x00\xfb"), x(trusted+"protattr", "i")),
				dir("/d", x(trusted+"impure", "y"), x(trusted+"uuid", "u"), x("security.capability", "c")),
			},
			want: []string{add("/a"), add("/d")}},
		{name: "another prefix's overlay xattrs are not overlayfs's",
			entries: []upperEntry{dir("/d", x("user.overlay.opaque", "y"), x("user.overlay.redirect", "/x"))},
			want:    []string{add("/d")}},
		{name: "userxattr: the opaque mark under user.overlay.",
			prefix:  "user.overlay.",
			entries: []upperEntry{dir("/d", x("user.overlay.opaque", "y"), x(trusted+"redirect", "/x"))},
			want:    []string{add("/d"), del("/d/.wh..opq")}},
		{name: "userxattr: an unknown user.overlay. xattr",
			prefix:  "user.overlay.",
			entries: []upperEntry{file("/f", x("user.overlay.metacopy", ""))},
			refused: "/f has xattr user.overlay.metacopy"},
		{name: "redirect is refused",
			entries: []upperEntry{dir("/ok"), dir("/moved", x(trusted+"redirect", "/old"))},
			refused: "/moved has xattr trusted.overlay.redirect"},
		{name: "metacopy is refused",
			entries: []upperEntry{file("/f", x(trusted+"metacopy", ""))},
			refused: "/f has xattr trusted.overlay.metacopy"},
		{name: "a whiteout xattr on a file is refused",
			entries: []upperEntry{file("/w", x(trusted+"whiteout", ""))},
			refused: "/w has xattr trusted.overlay.whiteout"},
		{name: "an opaque value other than y is refused",
			entries: []upperEntry{dir("/d", x(trusted+"opaque", "x"))},
			refused: `/d has xattr trusted.overlay.opaque="x"`},
		{name: "an opaque file is refused",
			entries: []upperEntry{file("/f", x(trusted+"opaque", "y"))},
			refused: `/f has xattr trusted.overlay.opaque="y"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := overlayDiff{prefix: tc.prefix}
			if d.prefix == "" {
				d.prefix = trusted
			}
			var err error
			for _, e := range tc.entries {
				if err = d.add(e); err != nil {
					break
				}
			}
			if tc.refused != "" {
				if !errors.Is(err, errNoUpperDir) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("got %v, want errNoUpperDir: %s", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := describeChanges(t, d.changes); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("changes %v, want %v", got, tc.want)
			}
		})
	}
}

// describeChanges writes changes as add and del do, and checks that each
// addition carries its entry's FileInfo and each deletion none.
func describeChanges(t *testing.T, changes []upperChange) []string {
	var out []string
	for _, c := range changes {
		switch c.kind {
		case fs.ChangeKindAdd:
			if c.fi != info(c.path) {
				t.Errorf("%s: added with FileInfo %v", c.path, c.fi)
			}
			out = append(out, add(c.path))
		case fs.ChangeKindDelete:
			if c.fi != nil {
				t.Errorf("%s: deleted with FileInfo %v", c.path, c.fi)
			}
			out = append(out, del(c.path))
		default:
			t.Errorf("%s: change of kind %v", c.path, c.kind)
		}
	}
	return out
}

// The changes held in memory are bounded: an opaque marker counts too.
func TestOverlayDiffBound(t *testing.T) {
	d := overlayDiff{prefix: trusted}
	if err := d.add(dir("/d", x(trusted+"opaque", "y"))); err != nil {
		t.Fatal(err)
	}
	for i := range maxUpperEntries - 2 {
		if err := d.add(file(fmt.Sprintf("/d/f%d", i))); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	if len(d.changes) != maxUpperEntries {
		t.Fatalf("%d changes, want %d", len(d.changes), maxUpperEntries)
	}
	if err := d.add(file("/last")); !errors.Is(err, errNoUpperDir) {
		t.Fatalf("change %d: %v, want errNoUpperDir", maxUpperEntries+1, err)
	}
}
