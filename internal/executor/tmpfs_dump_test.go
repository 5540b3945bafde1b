//go:build linux

package executor_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/executor"
)

// TestDumpTmpfs parks a sandbox whose /run holds a directory, a symbolic
// link and a device, each with its own owner and time, and whose /dev/shm
// holds a file. The CRIU deploy/setup.sh builds
// (deploy/criu/4-tmpfs-small-dump.patch) writes the image of every tmpfs
// but /dev/shm itself; each such image must be what GNU tar writes for the
// same contents, header for header: GNU tar extracts it onto a fresh
// tmpfs and archives that again, with the arguments CRIU gives it. The
// restore then brings every mount back as it was.
func TestDumpTmpfs(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "tmpfsd"
	s, root, mounts := tmpfsSandbox(t, id, spec, out, func(root string) { fillRun(t, filepath.Join(root, "run")) })
	before := map[string]string{}
	for m := range mounts {
		before[m] = tmpfsListing(t, filepath.Join(root, m))
	}

	dir := t.TempDir()
	cp := executor.Checkpoint{ImageDir: filepath.Join(dir, "images"), Rootfs: filepath.Join(dir, "rootfs.tar")}
	if _, err := s.Checkpoint(ctx, cp); err != nil {
		t.Fatal(err)
	}
	// Read before the sandbox's destroy removes it.
	log, err := os.ReadFile(filepath.Join(client.Config().StateDir, "criu", id, "dump", "dump.log"))
	if err := errors.Join(err, s.Destroy(ctx)); err != nil {
		t.Fatal(err)
	}
	if n, want := bytes.Count(log, []byte("dumped without tar")), tmpfsCount(mounts)-1; n != want {
		t.Errorf("dump.log: %d tmpfs mounts dumped without tar, want %d (all %d but /dev/shm's)", n, want, tmpfsCount(mounts))
	}
	for m, dev := range mounts {
		if m == "/dev/shm" {
			continue
		}
		img := filepath.Join(cp.ImageDir, fmt.Sprintf("tmpfs-dev-%d.tar.gz.img", dev))
		if got, want := tarHeaders(t, img), tarHeaders(t, tarAgain(t, img)); !maps.EqualFunc(got, want, bytes.Equal) {
			t.Errorf("%s: CRIU's image has headers\n%s\nGNU tar writes for the same contents\n%s", m, dumpHeaders(got), dumpHeaders(want))
		}
	}

	restoreListings(t, ctx, id, spec, cp, out, before)
}

// fillRun puts into run an empty directory, a symbolic link and a
// character device, with owners and times of their own.
func fillRun(t *testing.T, run string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(run, "sub"), 0o750))
	must(os.Symlink("/no/such/target", filepath.Join(run, "lnk")))
	must(syscall.Mknod(filepath.Join(run, "nul"), syscall.S_IFCHR|0o640, 1<<8|3))
	for i, name := range []string{"sub", "lnk", "nul", "."} {
		p := filepath.Join(run, name)
		must(os.Lchown(p, 100+i, 200+i))
		ts := unix.NsecToTimespec(time.Unix(1_700_000_000+int64(i), 0).UnixNano())
		must(unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// tarAgain extracts the gzipped tar img with GNU tar onto a fresh tmpfs,
// as CRIU's restore runs it, and archives that tmpfs again, as CRIU's dump
// runs it: the path of the new archive.
func tarAgain(t *testing.T, img string) string {
	t.Helper()
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Error(err)
		}
	}()
	runTar := func(args ...string) {
		t.Helper()
		if b, err := exec.Command("tar", args...).CombinedOutput(); err != nil || len(b) > 0 {
			t.Fatalf("tar %q: %v\n%s", args, err, b)
		}
	}
	runTar("--extract", "--gzip", "--no-unquote", "--no-wildcards", "--directory", mnt, "--file", img)
	again := filepath.Join(dir, "again.tar.gz")
	runTar("--create", "--gzip", "--no-unquote", "--no-wildcards", "--one-file-system", "--check-links",
		"--preserve-permissions", "--sparse", "--numeric-owner", "--directory", mnt, "--file", again, ".")
	return again
}

// tarHeaders is the 512-byte headers of the gzipped tar at path, by the
// name each holds, and, under "", what follows the last one: it must be
// zeros, padded as GNU tar pads.
func tarHeaders(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	hs := map[string][]byte{}
	off := 0
	for ; off+512 <= len(b) && !bytes.Equal(b[off:off+512], make([]byte, 512)); off += 512 {
		h := b[off : off+512]
		name := string(h[:bytes.IndexByte(append(h[:100:100], 0), 0)])
		if _, dup := hs[name]; dup || name == "" {
			t.Fatalf("%s: entry %q twice, or unnamed", path, name)
		}
		hs[name] = h
	}
	hs[""] = b[off:]
	return hs
}

// dumpHeaders prints headers for a failure: each name, then its bytes
// that are not NUL, by offset.
func dumpHeaders(hs map[string][]byte) string {
	var w bytes.Buffer
	for _, k := range slices.Sorted(maps.Keys(hs)) {
		if k == "" {
			fmt.Fprintf(&w, "  (end: %d bytes, zero: %v)\n", len(hs[k]), bytes.Count(hs[k], []byte{0}) == len(hs[k]))
			continue
		}
		fmt.Fprintf(&w, "  %q:", k)
		for i, c := range hs[k] {
			if c != 0 {
				fmt.Fprintf(&w, " %d=%q", i, c)
			}
		}
		w.WriteString("\n")
	}
	return w.String()
}
