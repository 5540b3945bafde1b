//go:build linux

package executor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/idmap"
)

// TestUserNamespaceTmpfs parks a sandbox with a user namespace whose /run
// holds an empty directory and an empty file, each with an in-namespace
// owner of its own. The CRIU deploy/setup.sh builds
// (deploy/criu/7-tmpfs-small-userns.patch) writes the image of every
// tmpfs itself (/dev holds runc's empty files under the devices it
// binds), each owner as the namespace maps it: header for header what GNU
// tar writes for the same contents. (An owner the namespace does not map
// cannot be in these mounts: they belong to the namespace, and the
// kernel refuses such an owner there.) The restore into the same range
// makes them without tar too, and every mount comes back as it was.
func TestUserNamespaceTmpfs(t *testing.T) {
	privileged(t)
	needsPatch(t, criu.TmpfsUserns)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	r := idmap.Range{Base: 1<<20 + 50*idmap.Size}
	spec.UserNS = &r
	const id = "userns-tmpfs"
	s := mustStart(t, id, spec, out)
	root := fmt.Sprintf("/proc/%d/root", s.Pid())
	run := filepath.Join(root, "run")
	if err := asRangeRoot(r, func() error {
		return errors.Join(os.Mkdir(filepath.Join(run, "sub"), 0o750), os.WriteFile(filepath.Join(run, "empty"), nil, 0o640))
	}); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(os.Lchown(filepath.Join(run, "sub"), int(r.Base)+7, int(r.Base)+8),
		os.Lchown(filepath.Join(run, "empty"), int(r.Base)+9, int(r.Base)+10)); err != nil {
		t.Fatal(err)
	}
	mounts := tmpfsDirs(t, s.Pid())
	if !hasKey(mounts, "/dev") || !hasKey(mounts, "/run") {
		t.Fatalf("tmpfs mounts %v: want /dev and /run among them", mounts)
	}
	before := map[string]string{}
	for m := range mounts {
		before[m] = tmpfsListingOwn(t, filepath.Join(root, m))
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
	want := tmpfsCount(mounts)
	if n := bytes.Count(log, []byte("owners as its user namespace maps them")); n != want {
		t.Errorf("dump.log: %d tmpfs mounts dumped without tar, want all %d", n, want)
	}
	for m, dev := range mounts {
		img := filepath.Join(cp.ImageDir, fmt.Sprintf("tmpfs-dev-%d.tar.gz.img", dev))
		got := tarHeaders(t, img)
		if want := tarHeaders(t, tarAgain(t, img)); !maps.EqualFunc(got, want, bytes.Equal) {
			t.Errorf("%s: CRIU's image has headers\n%s\nGNU tar writes for the same contents\n%s", m, dumpHeaders(got), dumpHeaders(want))
		}
		if m != "/run" {
			continue
		}
		for name, owner := range map[string]string{"./sub/": "0000007\x000000010\x00", "./empty": "0000011\x000000012\x00"} {
			if h := got[name]; len(h) != 512 || string(h[108:124]) != owner {
				t.Errorf("/run's image: %s's owner %q, want the in-namespace %q", name, h[108:124], owner)
			}
		}
	}

	s, _, err = client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	root = fmt.Sprintf("/proc/%d/root", s.Pid())
	for m, was := range before {
		if got := tmpfsListingOwn(t, filepath.Join(root, m)); got != was {
			t.Errorf("%s after the restore:\n%s\nwas:\n%s", m, got, was)
		}
	}
	log, err = os.ReadFile(filepath.Join(client.Config().StateDir, "criu", id, "restore", "restore.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(log, []byte("restored without tar")); n != want {
		t.Errorf("restore.log: %d tmpfs mounts restored without tar, want all %d", n, want)
	}
}

// tmpfsListingOwn is tmpfsListing without /dev/mqueue's line: what it
// shows is the root of the message queue file system mounted there (CRIU
// mounts it again at the restore, its owner as it makes it), not an
// entry of /dev's tmpfs.
func tmpfsListingOwn(t *testing.T, dir string) string {
	t.Helper()
	var keep []string
	for _, l := range strings.Split(tmpfsListing(t, dir), "\n") {
		if filepath.Base(dir) != "dev" || !strings.HasPrefix(l, "mqueue ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// asRangeRoot runs f on a thread of its own whose file system ids are
// r's base, the sandbox's root: a file made in a tmpfs of the sandbox's
// user namespace must have an owner the namespace maps, and the host's
// root is not one. The thread ends with f.
func asRangeRoot(r idmap.Range, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		unix.Setfsgid(int(r.Base))
		unix.Setfsuid(int(r.Base))
		done <- f()
	}()
	return <-done
}
