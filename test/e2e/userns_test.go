package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// TestUserNamespace (serve --user-namespaces, the default): a hostile unit reads its
// /proc/self/uid_map and status: uid 0 in the sandbox is a host range's
// base, not the host's root. Seen from the host, every task of the
// sandbox is that unprivileged user, with containerd's default
// capabilities, no_new_privs and a seccomp filter: after the run, after
// an eager resume (--lazy-resume=false), and after an export and import to
// a second host that resumes it lazily at its defaults, each chunk served
// by the page server (its own range there).
func TestUserNamespace(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := mustDaemon(t, "userns-a", func(d *daemon) { d.flags = []string{"--lazy-resume=false"} })
	b := mustDaemon(t, "userns-b") // lazy, served: the defaults
	for _, d := range []*daemon{a, b} {
		mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	}
	trustHost(t, a, b)
	const id = "userns"
	startHostile(t, a, id, "privileges", nil, unit.Grants{MemoryBytes: 256 << 20})
	said := waitSaid(t, a, id, "privileges", "uid_map=")
	base := unprivileged(t, a, id)
	if want := fmt.Sprintf("uid_map=0 %d 65536", base); said != want {
		t.Fatalf("the unit reads %q, want %q", said, want)
	}
	if _, err := a.c.Park(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Resume(ctx, id); err != nil {
		t.Fatalf("eager resume: %v", err)
	}
	if again := unprivileged(t, a, id); again != base {
		t.Fatalf("resumed here at %d, the run's range is %d", again, base)
	}
	if _, err := a.c.Park(ctx, id); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := a.c.Export(ctx, id, &buf); err != nil {
		t.Fatal(err)
	}
	bundleHostBase(t, buf.Bytes())
	if _, err := b.c.Import(ctx, bytes.NewReader(buf.Bytes()), ""); err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, b, id)
	r, err := b.c.Resume(ctx, id)
	if err != nil {
		t.Fatalf("lazy resume of the import: %v", err)
	}
	if off := fastPathOff(t, b, "--lazy-resume"); off != "" {
		t.Logf("the second host resumed eagerly: it turned --lazy-resume off: %s", off)
	} else if r.Restore == nil || !r.Restore.Lazy || r.Restore.Served == (fastPathOff(t, b, "--lazy-served") != "") {
		t.Fatalf("the second host's resume: %+v, want a lazy restore, served unless turned off", r.Restore)
	}
	unprivileged(t, b, id)
}

// unprivileged checks every task of run id's sandbox on d from the host:
// its uid map is one range of 65536 ids from a base at or past 2^20, it
// runs as that base (real, effective, saved, filesystem uid and gid),
// with containerd's default capabilities, no_new_privs and a seccomp
// filter. It returns the base.
func unprivileged(t *testing.T, d *daemon, id string) uint32 {
	t.Helper()
	pids := strings.Fields(sandboxCgroupFile(t, d, "pids", id, "cgroup.procs"))
	if len(pids) == 0 {
		t.Fatalf("sandbox %s has no task", id)
	}
	var want uint64
	for _, c := range []int{0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31} {
		want |= 1 << c
	}
	var base uint32
	for _, pid := range pids {
		m, err := os.ReadFile("/proc/" + pid + "/uid_map")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(m))
		if len(f) != 3 || f[0] != "0" || f[2] != "65536" {
			t.Fatalf("task %s: uid_map %q, want one range of 65536 ids from 0", pid, m)
		}
		b, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil || b < 1<<20 || b%65536 != 0 || (base != 0 && uint32(b) != base) {
			t.Fatalf("task %s: host base %s, want an aligned range past 2^20 (%d)", pid, f[1], base)
		}
		base = uint32(b)
		st, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(st), "\n") {
			k, v, _ := strings.Cut(l, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "Uid", "Gid":
				for _, x := range strings.Fields(v) {
					if x != f[1] {
						t.Fatalf("task %s: %s %q, want the range's base %s", pid, k, v, f[1])
					}
				}
			case "CapEff", "CapBnd":
				if c, err := strconv.ParseUint(v, 16, 64); err != nil || c != want {
					t.Fatalf("task %s: %s %s, want containerd's default set %x", pid, k, v, want)
				}
			case "NoNewPrivs":
				if v != "1" {
					t.Fatalf("task %s: NoNewPrivs %s", pid, v)
				}
			case "Seccomp":
				if v != "2" {
					t.Fatalf("task %s: Seccomp %s, want a filter", pid, v)
				}
			}
		}
	}
	return base
}

// TestUserNamespaceOldPark: a park made by a host running units as its
// root (it needs host-root units: --user-namespaces=false
// --allow-host-root-images) resumes on it once it runs them in user
// namespaces only if the images have one: they do not, so the resume is
// refused with image_refused naming userns, nothing runs, and the run
// stays parked; under --allow-host-root-images it resumes as it was, as
// the host's root.
func TestUserNamespaceOldPark(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := mustDaemon(t, "userns-old", func(d *daemon) {
		d.flags = []string{"--user-namespaces=false", "--allow-host-root-images"}
	})
	mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	const id = "userns-old"
	startHostile(t, d, id, "privileges", nil, unit.Grants{MemoryBytes: 256 << 20})
	waitSaid(t, d, id, "privileges", "uid_map=")
	if _, err := d.c.Park(ctx, id); err != nil {
		t.Fatal(err)
	}
	restartWith := func(flags ...string) {
		t.Helper()
		if err := d.stop(); err != nil {
			t.Fatal(err)
		}
		d.flags = flags
		if err := d.start(); err != nil {
			t.Fatal(err)
		}
	}
	restartWith()
	was, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.c.Resume(ctx, id)
	ae := apiError(t, err, api.CodeImageRefused)
	if !strings.Contains(ae.Message, "userns") {
		t.Fatalf("refused, not naming userns: %v", ae)
	}
	unchanged(t, d, id, was)
	restartWith("--allow-host-root-images")
	if _, err := d.c.Resume(ctx, id); err != nil {
		t.Fatalf("the park did not stay whole: %v", err)
	}
	for _, pid := range strings.Fields(sandboxCgroupFile(t, d, "pids", id, "cgroup.procs")) {
		m, err := os.ReadFile("/proc/" + pid + "/uid_map")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(string(m)); len(f) != 3 || f[1] != "0" || f[2] != "4294967295" {
			t.Fatalf("resumed under --allow-host-root-images, task %s has uid_map %q, want the host's", pid, m)
		}
	}
}

// bundleHostBase checks that the bundle raw carries one user namespace
// image, whose maps have host base 0: the range is this host's alone.
func bundleHostBase(t *testing.T, raw []byte) {
	t.Helper()
	magic := []byte{0x19, 0x43, 0x56, 0x54, 0x06, 0x49, 0x47, 0x55} // CRIU's image set, then USERNS
	n := 0
	for _, o := range readBundle(t, raw).Objects {
		if !bytes.HasPrefix(o.Bytes, magic) {
			continue
		}
		n++
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "userns-1.img"), o.Bytes, 0o600); err != nil {
			t.Fatal(err)
		}
		im, err := criu.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range im.Userns {
			for _, e := range append(u.GetUidMap(), u.GetGidMap()...) {
				if e.GetLowerFirst() != 0 || e.GetFirst() != 0 || e.GetCount() != 65536 {
					t.Fatalf("the bundle's user namespace image maps %d %d %d, want host base 0", e.GetFirst(), e.GetLowerFirst(), e.GetCount())
				}
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d user namespace images in the bundle, want 1", n)
	}
}
