//go:build linux

// The rw layer's fast path (writeOverlayDiff) against the diff service,
// on the test daemon of executor_test.go: equivalence tests and the
// benchmark. The package internals they use are exported to them by
// export_test.go.

package executor_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/executor"
)

// snapFixture makes snapshots under a lease of its own and removes them,
// and the lease, when the test ends.
type snapFixture struct {
	tb     testing.TB
	ctx    context.Context // namespaced, with the lease
	cc     *containerd.Client
	sn     snapshots.Snapshotter
	prefix string
	names  []string // snapshots to remove, in order of creation
}

func newSnapFixture(tb testing.TB) *snapFixture {
	tb.Helper()
	ctx := client.NamespacedForTest(context.Background())
	cc := client.ContainerdForTest()
	ls := cc.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		tb.Fatal(err)
	}
	f := &snapFixture{
		tb:     tb,
		ctx:    leases.WithLease(ctx, l.ID),
		cc:     cc,
		sn:     cc.SnapshotService(executor.Snapshotter),
		prefix: fmt.Sprintf("rwlayer-%d-", time.Now().UnixNano()),
	}
	tb.Cleanup(func() {
		for _, name := range slices.Backward(f.names) {
			if err := f.sn.Remove(ctx, name); err != nil && !errdefs.IsNotFound(err) {
				tb.Errorf("remove snapshot %s: %v", name, err)
			}
		}
		if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil {
			tb.Errorf("delete lease: %v", err)
		}
		err := f.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if strings.HasPrefix(info.Name, f.prefix) {
				tb.Errorf("snapshot %s left behind", info.Name)
			}
			return nil
		})
		if err != nil {
			tb.Error(err)
		}
	})
	return f
}

// imageChain is the chain ID of the oracle image: the snapshot its
// sandboxes are made over.
func (f *snapFixture) imageChain() string {
	f.tb.Helper()
	img, err := f.cc.GetImage(f.ctx, oracle.Name)
	if err != nil {
		f.tb.Fatal(err)
	}
	diffIDs, err := img.RootFS(f.ctx)
	if err != nil {
		f.tb.Fatal(err)
	}
	return identity.ChainID(diffIDs).String()
}

// prepare makes the active snapshot prefix+name over parent.
func (f *snapFixture) prepare(name, parent string) (string, []mount.Mount) {
	f.tb.Helper()
	key := f.prefix + name
	mounts, err := f.sn.Prepare(f.ctx, key, parent)
	if err != nil {
		f.tb.Fatal(err)
	}
	f.names = append(f.names, key)
	return key, mounts
}

// apply makes a snapshot over parent with the layer tar at path applied as
// the restore path applies the rw layer.
func (f *snapFixture) apply(name, parent, path string) (string, []mount.Mount) {
	f.tb.Helper()
	key, mounts := f.prepare(name, parent)
	if err := client.ApplyLayerForTest(f.ctx, key, path, mounts); err != nil {
		f.tb.Fatalf("apply %s: %v", path, err)
	}
	return key, mounts
}

// layer commits a snapshot over parent holding the layer tar at path, as
// an image unpack does, and returns its name.
func (f *snapFixture) layer(name, parent, path string) string {
	f.tb.Helper()
	key, _ := f.apply(name+"-unpack", parent, path)
	committed := f.prefix + name
	if err := f.sn.Commit(f.ctx, committed, key); err != nil {
		f.tb.Fatal(err)
	}
	f.names[len(f.names)-1] = committed
	return committed
}

// mountAt mounts mounts on a new directory until the test ends.
func mountAt(tb testing.TB, mounts []mount.Mount) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "rootfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := mount.All(mounts, dir); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := mount.UnmountAll(dir, 0); err != nil {
			tb.Error(err)
		}
	})
	return dir
}

// ent is one entry of a layer tar written by a test.
type ent struct {
	name   string
	typ    byte
	mode   int64
	data   string
	link   string
	uid    int
	xattrs map[string]string
	major  int64
	minor  int64
}

// layerTime is the mtime of every entry of a test layer: sub-second, to
// see where a layer truncates mtimes.
var layerTime = time.Date(2021, 3, 4, 5, 6, 7, 123456789, time.UTC)

func writeLayer(tb testing.TB, ents []ent) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "layer.tar")
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, e := range ents {
		hdr := &tar.Header{
			Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link,
			Uid: e.uid, Gid: e.uid, Size: int64(len(e.data)), ModTime: layerTime,
			Devmajor: e.major, Devminor: e.minor, Format: tar.FormatPAX,
		}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		for k, v := range e.xattrs {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(hdr); err != nil {
			tb.Fatal(err)
		}
		if hdr.Size > 0 {
			if _, err := io.WriteString(tw, e.data); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return path
}

func dir(name string) ent { return ent{name: name + "/", typ: tar.TypeDir, mode: 0o755} }
func file(name, data string) ent {
	return ent{name: name, typ: tar.TypeReg, mode: 0o644, data: data}
}

// capability is a security.capability value (VFS_CAP_REVISION_2,
// effective, CAP_NET_BIND_SERVICE permitted).
func capability() string {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000001)
	binary.LittleEndian.PutUint32(b[4:], 1<<unix.CAP_NET_BIND_SERVICE)
	return string(b)
}

// node is what a tree compare looks at of one path.
type node struct {
	mode     fs.FileMode
	uid, gid uint32
	nlink    uint64 // non-directories
	size     int64  // non-directories
	sum      string // regular files
	link     string // symlinks
	rdev     uint64
	xattrs   string
	links    string // the other names of the same inode, for nlink > 1
	mtime    time.Time
}

func (n node) String() string {
	return fmt.Sprintf("%v %d:%d nlink=%d size=%d sum=%.12s link=%q rdev=%d xattrs=%q links=%q mtime=%s",
		n.mode, n.uid, n.gid, n.nlink, n.size, n.sum, n.link, n.rdev, n.xattrs, n.links, n.mtime.Format(time.RFC3339Nano))
}

// readTree describes every path under root (not root itself).
func readTree(tb testing.TB, root string) map[string]node {
	tb.Helper()
	tree := map[string]node{}
	inodes := map[uint64][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel := path[len(root):]
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		n := node{mode: fi.Mode(), uid: st.Uid, gid: st.Gid, rdev: st.Rdev, mtime: fi.ModTime()}
		if !fi.IsDir() {
			n.nlink, n.size = st.Nlink, fi.Size()
			if st.Nlink > 1 {
				inodes[st.Ino] = append(inodes[st.Ino], rel)
			}
		}
		switch {
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			n.sum = hex.EncodeToString(sum[:])
		case fi.Mode()&fs.ModeSymlink != 0:
			if n.link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		n.xattrs = xattrs(tb, path)
		tree[rel] = n
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	for _, names := range inodes {
		for _, name := range names {
			n := tree[name]
			n.links = strings.Join(names, ",")
			tree[name] = n
		}
	}
	return tree
}

func xattrs(tb testing.TB, path string) string {
	tb.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if err != nil {
		tb.Fatalf("llistxattr %s: %v", path, err)
	}
	var out []string
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		v := make([]byte, 4096)
		m, err := unix.Lgetxattr(path, name, v)
		if err != nil {
			tb.Fatalf("lgetxattr %s %s: %v", path, name, err)
		}
		out = append(out, fmt.Sprintf("%s=%x", name, v[:m]))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// capOnly is xattrs as an OCI layer written by containerd carries them:
// only security.capability.
func capOnly(x string) string {
	var out []string
	for f := range strings.FieldsSeq(x) {
		if strings.HasPrefix(f, "security.capability=") {
			out = append(out, f)
		}
	}
	return strings.Join(out, " ")
}

// compareLayers checks the trees the two layers made (fast, slow) against
// each other and against src, the tree they were taken from.
//
// Against src, either may lose what an OCI layer as containerd's
// ChangeWriter writes it does not carry: sockets, xattrs other than
// security.capability (on what the layer writes), and the sub-second part
// of mtimes (the layer has whole seconds, for what it writes). Nothing
// else: names, types, modes, owners, sizes, contents, symlink targets,
// device numbers, link counts and which names share an inode are all
// src's.
//
// Between fast and slow everything is equal but at the paths of
// rewritten: entries the snapshot copied up without changing anything the
// diff service compares (content, size, mode, owner, mtime; not other
// xattrs). The diff service leaves them out of its layer, so the image's
// entry stays, with its mtime and xattrs; the fast path writes them: its
// mtime is src's at whole seconds, and of the xattrs only
// security.capability stays.
func compareLayers(t *testing.T, src, fast, slow map[string]node, rewritten ...string) {
	t.Helper()
	paths := map[string]bool{}
	for _, tree := range []map[string]node{src, fast, slow} {
		for p := range tree {
			paths[p] = true
		}
	}
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		s, inSrc := src[p]
		f, inFast := fast[p]
		w, inSlow := slow[p]
		if inFast != inSlow {
			t.Errorf("%s: in fast %v (%v), in diff service %v (%v)", p, inFast, f, inSlow, w)
			continue
		}
		if inSrc && s.mode&fs.ModeSocket != 0 {
			if inFast {
				t.Errorf("%s: a socket came through: %v", p, f)
			}
			continue
		}
		if inSrc != inFast {
			t.Errorf("%s: in the source %v (%v), in both layers' trees %v (%v)", p, inSrc, s, inFast, f)
			continue
		}
		rw := slices.Contains(rewritten, p)
		if rw {
			want := w
			want.mtime = w.mtime.Truncate(time.Second)
			want.xattrs = capOnly(w.xattrs)
			if f != want || w.mtime.Equal(want.mtime) {
				t.Errorf("%s, rewritten by the fast path only:\n  fast:    %v\n  diffsvc: %v", p, f, w)
			}
		} else if f != w {
			t.Errorf("%s:\n  fast:    %v\n  diffsvc: %v", p, f, w)
		}
		for _, got := range []struct {
			name string
			n    node
		}{{"fast", f}, {"diffsvc", w}} {
			n, want := got.n, s
			if n.mtime.Equal(s.mtime.Truncate(time.Second)) {
				want.mtime = n.mtime
			}
			// On a rewritten entry the diff service keeps the image's
			// xattrs: it does not see a change of xattrs.
			if n.xattrs != s.xattrs && (n.xattrs == capOnly(s.xattrs) || rw && got.name == "diffsvc") {
				want.xattrs = n.xattrs
			}
			if n != want {
				t.Errorf("%s:\n  source:  %v\n  %-8s %v", p, s, got.name+":", n)
			}
		}
	}
}

// layerEntries lists a layer tar's entries, one "type name[->link]" each.
func layerEntries(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		s := fmt.Sprintf("%c %s", hdr.Typeflag, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeLink, tar.TypeSymlink:
			s += "->" + hdr.Linkname
		case tar.TypeChar, tar.TypeBlock:
			s += fmt.Sprintf(" %d:%d", hdr.Devmajor, hdr.Devminor)
		}
		out = append(out, s)
	}
}

// layers makes the rw layer of the active snapshot key (mounts) both ways,
// applies each onto a fresh snapshot over parent, and returns the two
// trees and the two tars.
func layers(t *testing.T, f *snapFixture, key string, mounts []mount.Mount, parent string) (fast, slow map[string]node, fastTar, slowTar string) {
	t.Helper()
	dir := t.TempDir()
	fastTar, slowTar = filepath.Join(dir, "fast.tar"), filepath.Join(dir, "diffsvc.tar")
	// The caller's context as exportRootfs gets it: no lease of the test's.
	ctx := client.NamespacedForTest(context.Background())
	t0 := time.Now()
	nf, err := executor.WriteOverlayDiffFile(ctx, mounts, fastTar, 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	ns, err := client.DiffServiceLayerForTest(ctx, executor.Snapshotter, key, slowTar)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fast path %d B in %v; diff service %d B in %v", nf, t1.Sub(t0), ns, time.Since(t1))
	read := func(name, path string) map[string]node {
		_, m := f.apply(name, parent, path)
		var tree map[string]node
		if err := mount.WithReadonlyTempMount(f.ctx, m, func(root string) error {
			tree = readTree(t, root)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return tree
	}
	return read("fast", fastTar), read("diffsvc", slowTar), fastTar, slowTar
}

// TestRwLayerOverlayEquivalence makes changes of every kind through a
// snapshot's overlay mount, over a three-layer chain (the oracle image and
// two test layers, so that the upper directory whites out entries of
// every lower layer), and checks that the fast path's layer and the diff
// service's make the same tree when applied as a restore applies them,
// and that it is the tree the snapshot showed.
func TestRwLayerOverlayEquivalence(t *testing.T) {
	privileged(t)
	f := newSnapFixture(t)
	caps := capability()
	a := f.layer("A", f.imageChain(), writeLayer(t, []ent{
		dir("base"), file("base/keep.txt", "keep"), file("base/modify.txt", "original"),
		file("base/delete.txt", "to delete"), file("base/chmod.txt", "chmod me"),
		dir("base/deldir"), file("base/deldir/a", "a"), dir("base/deldir/sub"), file("base/deldir/sub/b", "b"),
		dir("base/opaque"), file("base/opaque/x", "old x"), file("base/opaque/y", "old y"),
		dir("base/opaque/sub"), file("base/opaque/sub/z", "old z"),
		dir("base/dir2file"), file("base/dir2file/f", "f"), file("base/file2dir", "file"),
		dir("base/chowndir"), file("base/chowndir/f", "f"),
		dir("base/chmoddir"), file("base/chmoddir/f", "f"),
		dir("base/deep"), dir("base/deep/a"), dir("base/deep/a/b"), dir("base/deep/a/b/c"),
		file("base/deep/a/b/c/file", "deep"),
		{name: "base/link-dangling", typ: tar.TypeSymlink, link: "/nonexistent/target"},
		{name: "base/link-abs", typ: tar.TypeSymlink, link: "/etc/hostname"},
		{name: "base/link-rel", typ: tar.TypeSymlink, link: "keep.txt"},
		file("base/hl1", "linked"), {name: "base/hl2", typ: tar.TypeLink, link: "base/hl1"},
		file("base/hl3", "linked too"), {name: "base/hl4", typ: tar.TypeLink, link: "base/hl3"},
		{name: "base/caps", typ: tar.TypeReg, mode: 0o755, data: "cap", xattrs: map[string]string{"security.capability": caps}},
		{name: "base/caps-mod", typ: tar.TypeReg, mode: 0o755, data: "cap", xattrs: map[string]string{"security.capability": caps}},
		{name: "base/userx", typ: tar.TypeReg, mode: 0o644, data: "x", xattrs: map[string]string{"user.img": "v"}},
		{name: "base/userx-mod", typ: tar.TypeReg, mode: 0o644, data: "x", xattrs: map[string]string{"user.img": "v"}},
		file("base/openw.txt", "opened for writing, not written"),
		file("base/truncate.txt", "will be empty"), file("base/append.txt", "start"),
		file("base/touch.txt", "touched"), file("base/mvfile.txt", "moved"),
		dir("base/mvdir"), dir("base/mvdir/in"), file("base/mvdir/in/f", "in a moved dir"),
		file("base/gone-in-B.txt", "B deletes this"),
		dir("base/opaqueB"), file("base/opaqueB/old1", "B hides this"),
		{name: "base/fifo", typ: tar.TypeFifo, mode: 0o644},
		{name: "base/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		{name: "base/setuid", typ: tar.TypeReg, mode: 0o4755, data: "suid"},
		{name: "base/owned", typ: tar.TypeReg, mode: 0o640, data: "owned", uid: 1234},
		dir("deeper"), file("deeper/onlyA.txt", "only in A"), file("deeper/keepA.txt", "kept"),
	}))
	b := f.layer("B", a, writeLayer(t, []ent{
		dir("base"), file("base/modify.txt", "modified in B"), file("base/fromB.txt", "from B"),
		file("base/.wh.gone-in-B.txt", ""),
		dir("base/opaqueB"), file("base/opaqueB/.wh..wh..opq", ""), file("base/opaqueB/new1", "B1"), file("base/opaqueB/new2", "B2"),
	}))
	key, mounts := f.prepare("work", b)
	t.Logf("work snapshot mounts: %+v", mounts)
	root := mountAt(t, mounts)
	p := func(name string) string { return filepath.Join(root, name) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, data string, mode os.FileMode) { t.Helper(); must(os.WriteFile(p(name), []byte(data), mode)) }

	// New files and directories, an empty file, a big file.
	write("base/new.txt", "hello", 0o644)
	write("base/empty", "", 0o644)
	must(os.MkdirAll(p("newdir/deep/er"), 0o750))
	write("newdir/deep/er/file", "deep new", 0o600)
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	must(os.WriteFile(p("newdir/big"), big, 0o644))
	// Modified files of the lower layers: one last written by B, one by
	// A deep in copied-up directories, a truncate, an append.
	write("base/modify.txt", "modified in the sandbox", 0o644)
	write("base/deep/a/b/c/file", "deep, modified", 0o644)
	must(os.Truncate(p("base/truncate.txt"), 0))
	af, err := os.OpenFile(p("base/append.txt"), os.O_WRONLY|os.O_APPEND, 0)
	must(err)
	_, err = af.WriteString(" and more")
	must(err)
	must(af.Close())
	// A copy-up of a file that does not change it: opened for writing,
	// closed.
	of, err := os.OpenFile(p("base/openw.txt"), os.O_WRONLY, 0)
	must(err)
	must(of.Close())
	// Deletions: a file of A, a file of A no layer above touches, a
	// directory tree, a dangling symlink (the diff service's walk and
	// continuity's DiffDirChanges stat the base through symlinks), a fifo,
	// a file B replaced.
	must(os.Remove(p("base/delete.txt")))
	must(os.Remove(p("deeper/onlyA.txt")))
	must(os.RemoveAll(p("base/deldir")))
	must(os.Remove(p("base/link-dangling")))
	must(os.Remove(p("base/fifo")))
	must(os.Remove(p("base/opaqueB/new1")))
	// A file over B's whiteout.
	write("base/gone-in-B.txt", "back again", 0o644)
	// A directory replaced by a file, a file by a directory.
	must(os.RemoveAll(p("base/dir2file")))
	write("base/dir2file", "now a file", 0o644)
	must(os.Remove(p("base/file2dir")))
	must(os.Mkdir(p("base/file2dir"), 0o700))
	write("base/file2dir/child", "in the new dir", 0o644)
	// An opaque directory: removed with its tree, made again, with a name
	// of the old content reused.
	must(os.RemoveAll(p("base/opaque")))
	must(os.Mkdir(p("base/opaque"), 0o755))
	write("base/opaque/x", "new x", 0o644)
	write("base/opaque/w", "new w", 0o644)
	// Renames: a file, and a directory (overlay refuses the rename with
	// EXDEV without redirect_dir; mv copies).
	must(os.Rename(p("base/mvfile.txt"), p("base/moved.txt")))
	if out, err := exec.Command("mv", p("base/mvdir"), p("base/moveddir")).CombinedOutput(); err != nil {
		t.Fatalf("mv: %v: %s", err, out)
	}
	// Symlinks.
	must(os.Symlink("new.txt", p("base/newlink")))
	must(os.Symlink("/etc/passwd", p("newdir/abslink")))
	must(os.Symlink("/nowhere", p("newdir/dangling")))
	// Hard links: between new files; to a lower file (copied up first);
	// one name of a lower hard-linked pair modified (overlay breaks the
	// link on copy-up), and one chmodded.
	write("newdir/h1", "hard", 0o644)
	must(os.Link(p("newdir/h1"), p("newdir/h2")))
	must(os.Link(p("base/keep.txt"), p("newdir/keep-link")))
	write("base/hl1", "linked, modified", 0o644)
	must(os.Chmod(p("base/hl3"), 0o600))
	// Mode and owner of a lower file, of lower directories (one only
	// chowned: nothing else of it changes), setuid and sticky bits.
	must(os.Chmod(p("base/chmod.txt"), 0o600))
	must(os.Lchown(p("base/chmod.txt"), 1000, 1000))
	must(os.Lchown(p("base/chowndir"), 1000, 1001))
	must(os.Chmod(p("base/chmoddir"), 0o700))
	must(os.Lchown(p("base/owned"), 0, 0))
	must(os.Chmod(p("base/setuid"), 0o755))
	write("newdir/suid", "suid", 0o644)
	must(os.Chmod(p("newdir/suid"), 0o4755|os.ModeSetgid))
	must(os.Mkdir(p("newdir/sticky"), 0o777))
	must(os.Chmod(p("newdir/sticky"), 0o777|os.ModeSticky))
	must(os.Lchown(p("newdir/sticky"), 1000, 1000))
	must(os.Lchown(p("newdir/dangling"), 1000, 1000))
	// An mtime set on a lower file.
	must(os.Chtimes(p("base/touch.txt"), time.Time{}, time.Date(2000, 1, 2, 3, 4, 5, 6, time.UTC)))
	// Xattrs: a capability and a user xattr on new files and on lower
	// files (the layer carries only security.capability).
	write("newdir/capfile", "cap", 0o755)
	must(unix.Lsetxattr(p("newdir/capfile"), "security.capability", []byte(caps), 0))
	write("newdir/userx", "x", 0o644)
	must(unix.Lsetxattr(p("newdir/userx"), "user.test", []byte("value"), 0))
	must(unix.Lsetxattr(p("base/userx-mod"), "user.more", []byte("w"), 0))
	write("base/caps-mod", "cap, modified", 0o755) // a write drops the capability
	// A fifo, a device node, a socket (no layer carries sockets).
	must(unix.Mkfifo(p("newdir/fifo"), 0o640))
	must(unix.Mknod(p("newdir/null"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p("newdir/sock"), Net: "unix"})
	must(err)
	l.SetUnlinkOnClose(false)
	must(l.Close())

	src := readTree(t, root)
	fast, slow, fastTar, slowTar := layers(t, f, key, mounts, b)
	// openw.txt was opened for writing, userx-mod got a user xattr: both
	// copied up, neither changed in what the diff service compares.
	compareLayers(t, src, fast, slow, "/base/openw.txt", "/base/userx-mod")
	t.Logf("%d paths compared", len(src))
	// The fast tar holds OCI whiteouts, opaque markers, no overlay
	// whiteouts (character devices 0:0).
	fe := layerEntries(t, fastTar)
	for _, want := range []string{
		"0 base/.wh.delete.txt", "0 deeper/.wh.onlyA.txt", "0 base/.wh.deldir", "0 base/.wh.link-dangling",
		"0 base/opaqueB/.wh.new1", "0 base/opaque/.wh..wh..opq", "0 base/.wh.mvfile.txt", "0 base/.wh.mvdir",
		"3 newdir/null 1:3",
	} {
		if !slices.Contains(fe, want) {
			t.Errorf("fast layer has no %q", want)
		}
	}
	for _, e := range fe {
		if strings.HasPrefix(e, "3 ") && strings.HasSuffix(e, " 0:0") {
			t.Errorf("fast layer has an overlay whiteout: %s", e)
		}
	}
	if testing.Verbose() {
		t.Logf("fast layer:\n%s", strings.Join(fe, "\n"))
		t.Logf("diff service layer:\n%s", strings.Join(layerEntries(t, slowTar), "\n"))
	}
}

// TestRwLayerOverlaySandbox takes the rw layer of a running (then frozen)
// oracle sandbox both ways and compares the trees they make over the
// image, and the tree its rootfs shows.
func TestRwLayerOverlaySandbox(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := newSnapFixture(t)
	out := outputs(t, "oracle")
	const id = "rwlayer"
	s := mustStart(t, id, oracleSpec(), out)
	waitLines(t, out.Stdout, "two lines", func(ls []line) bool { return len(ls) >= 2 })
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	cont, err := f.cc.LoadContainer(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cont.Info(f.ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := f.cc.SnapshotService(info.Snapshotter).Mounts(f.ctx, info.SnapshotKey)
	if err != nil {
		t.Fatal(err)
	}
	var src map[string]node
	if err := mount.WithReadonlyTempMount(f.ctx, mounts, func(root string) error {
		src = readTree(t, root)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	fast, slow, fastTar, _ := layers(t, f, info.SnapshotKey, mounts, f.imageChain())
	compareLayers(t, src, fast, slow)
	t.Logf("fast layer: %v", layerEntries(t, fastTar))
	if _, ok := src["/tmp/oracle.dat"]; !ok {
		t.Errorf("the oracle's file is not in the sandbox's tree")
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRwLayerOverlayNoUpperDir: snapshots whose mounts have no upper
// directory (a snapshot with no parent is a bind mount, a view a read-only
// overlay) get errNoUpperDir, with nothing written.
func TestRwLayerOverlayNoUpperDir(t *testing.T) {
	privileged(t)
	f := newSnapFixture(t)
	_, bind := f.prepare("noparent", "")
	view, err := f.sn.View(f.ctx, f.prefix+"view", f.imageChain())
	if err != nil {
		t.Fatal(err)
	}
	f.names = append(f.names, f.prefix+"view")
	for name, mounts := range map[string][]mount.Mount{"no parent": bind, "view": view} {
		t.Run(name, func(t *testing.T) {
			t.Logf("mounts %+v", mounts)
			var buf bytes.Buffer
			err := executor.WriteOverlayDiff(f.ctx, mounts, &buf)
			if !errors.Is(err, executor.ErrNoUpperDir) || buf.Len() != 0 {
				t.Fatalf("%v, %d bytes written; want ErrNoUpperDir, nothing", err, buf.Len())
			}
		})
	}
}

// BenchmarkOverlayRwLayer: the rw layer of a small change (four files, 8
// KiB, one deletion, one modification) over a 40 MiB, 4000-file image
// layer, made by the fast path and by the diff service (each written
// whole to a file, as exportRootfs does), alternating, first one then
// the other. fast-ns/op and diffsvc-ns/op are each one's time,
// fast-tar-ns/op the fast path's tar alone (to io.Discard: no file);
// ns/op is the three together.
func BenchmarkOverlayRwLayer(b *testing.B) {
	if skipReason != "" {
		b.Skip(skipReason)
	}
	f := newSnapFixture(b)
	var ents []ent
	chunk := make([]byte, 10<<10)
	for d := range 40 {
		ents = append(ents, dir(fmt.Sprintf("data/d%02d", d)))
		for i := range 100 {
			_, _ = rand.Read(chunk)
			ents = append(ents, file(fmt.Sprintf("data/d%02d/f%03d", d, i), string(chunk)))
		}
	}
	ents = append([]ent{dir("data")}, ents...)
	big := f.layer("big", f.imageChain(), writeLayer(b, ents))
	key, mounts := f.prepare("work", big)
	root := mountAt(b, mounts)
	for i := range 4 {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("data/d%02d/new%d", i, i)), chunk[:2048], 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(root, "data/d10/f010")); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "data/d20/f020"), []byte("changed"), 0o644); err != nil {
		b.Fatal(err)
	}
	ctx := client.NamespacedForTest(context.Background())
	dir := b.TempDir()
	fast := func() time.Duration {
		t0 := time.Now()
		if _, err := executor.WriteOverlayDiffFile(ctx, mounts, filepath.Join(dir, "fast.tar"), 1<<62); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	slow := func() time.Duration {
		t0 := time.Now()
		if _, err := client.DiffServiceLayerForTest(ctx, executor.Snapshotter, key, filepath.Join(dir, "diffsvc.tar")); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	// The fast path's tar alone, not written to a file.
	tarOnly := func() time.Duration {
		t0 := time.Now()
		if err := executor.WriteOverlayDiff(ctx, mounts, io.Discard); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var fastTotal, slowTotal, tarTotal time.Duration
	n := 0
	for b.Loop() {
		if n%2 == 0 {
			fastTotal += fast()
			slowTotal += slow()
		} else {
			slowTotal += slow()
			fastTotal += fast()
		}
		tarTotal += tarOnly()
		n++
	}
	b.ReportMetric(float64(fastTotal.Nanoseconds())/float64(n), "fast-ns/op")
	b.ReportMetric(float64(slowTotal.Nanoseconds())/float64(n), "diffsvc-ns/op")
	b.ReportMetric(float64(tarTotal.Nanoseconds())/float64(n), "fast-tar-ns/op")
}

// TestApplyLayerLeasesAHeldBlob: a rw layer whose blob the content store
// already holds under another lease (the diff service's, say, which ends
// at any time) is applied with the blob leased by the apply's own lease,
// so that no collection removes it before the apply reads it.
func TestApplyLayerLeasesAHeldBlob(t *testing.T) {
	privileged(t)
	f := newSnapFixture(t)
	path := writeLayer(t, []ent{file("held", fmt.Sprint("held ", time.Now().UnixNano()))})
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromBytes(b), Size: int64(len(b))}
	ctx := client.NamespacedForTest(context.Background())
	other, err := f.cc.LeasesService().Create(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := content.WriteBlob(leases.WithLease(ctx, other.ID), f.cc.ContentStore(), "runrecordd-test-held", bytes.NewReader(b), desc); err != nil {
		t.Fatal(err)
	}
	f.apply("held", f.imageChain(), path)
	// The other lease ends, and a collection runs.
	if err := f.cc.LeasesService().Delete(ctx, other, leases.SynchronousDelete); err != nil {
		t.Fatal(err)
	}
	l, _ := leases.FromContext(f.ctx)
	rs, err := f.cc.LeasesService().ListResources(f.ctx, leases.Lease{ID: l})
	if err != nil {
		t.Fatal(err)
	}
	want := leases.Resource{ID: desc.Digest.String(), Type: "content"}
	if !slices.Contains(rs, want) {
		t.Fatalf("the lease the apply ran under holds %v; want the layer's blob %s", rs, desc.Digest)
	}
	if _, err := f.cc.ContentStore().Info(f.ctx, desc.Digest); err != nil {
		t.Fatalf("the layer's blob after the other lease ended: %v", err)
	}
}

// TestApplyLayerAfterAStaleIngest: an apply whose ref a failed one (or a
// dead daemon's) left partly written starts its blob afresh.
func TestApplyLayerAfterAStaleIngest(t *testing.T) {
	privileged(t)
	f := newSnapFixture(t)
	path := writeLayer(t, []ent{file("stale", "stale")})
	w, err := content.OpenWriter(f.ctx, f.cc.ContentStore(), content.WithRef("runrecordd-restore-"+f.prefix+"stale"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("left by a write that failed")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.apply("stale", f.imageChain(), path)
}
