//go:build linux

package e2e

// The sandbox's attacks (findings 6, 7 and 8 of issue 11; docs/trust.md,
// "What a unit can reach: the sandbox"): the hostile unit forks without
// end, writes into a writable mount below a read-only grant, leaves a
// sparse file of a terabyte for the park to copy, floods its stderr, and
// reports the privileges it holds; grant sets ask for host paths no unit
// may see. Each test checks that the host is untouched, the record
// unchanged where there is one, and the daemon still serving.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

func TestAttackSandbox(t *testing.T) {
	privileged(t)
	d := mustDaemon(t, "sandbox")
	mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	t.Run("ForkBomb", func(t *testing.T) { testForkBomb(t, d) })
	t.Run("SubmountWrite", func(t *testing.T) { testSubmountWrite(t, d) })
	t.Run("SocketBelowGrant", func(t *testing.T) { testSocketBelowGrant(t, d) })
	t.Run("MountSources", func(t *testing.T) { testMountSources(t, d) })
	t.Run("SparseFile", func(t *testing.T) { testSparseFile(t, d) })
	t.Run("LogFlood", func(t *testing.T) { testLogFlood(t, d) })
	t.Run("Privileges", func(t *testing.T) { testPrivileges(t, d) })
}

// startHostile starts the hostile unit as run id with attack and extra
// environment under grants (NoNetwork unless they say otherwise).
func startHostile(t *testing.T, d *daemon, id, attack string, env []string, g unit.Grants) {
	t.Helper()
	if g.Network == 0 {
		g.Network = unit.NoNetwork
	}
	_, err := d.c.Start(context.Background(), api.RunRequest{ID: id,
		Unit:   unit.Spec{Image: hostileImage, Env: append([]string{"HOSTILE=" + attack}, env...)},
		Grants: g})
	if err != nil {
		t.Fatalf("start %s (%s): %v", id, attack, err)
	}
	closeAtEnd(t, d, id)
}

// waitSaid waits until run id's stdout holds a "hostile: ATTACK: " line
// starting with prefix, and returns the rest of that line.
func waitSaid(t *testing.T, d *daemon, id, attack, prefix string) string {
	t.Helper()
	want := "hostile: " + attack + ": " + prefix
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(d.stdout(id))
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, want); ok {
				return prefix + rest
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %q from %s: stdout %q", want, id, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stillServing checks that the daemon answers and holds run id in phase.
func stillServing(t *testing.T, d *daemon, id, phase string) api.Run {
	t.Helper()
	r, err := d.run(context.Background(), id)
	if err != nil {
		t.Fatalf("the daemon no longer serves: %v", err)
	}
	if r.Phase != phase {
		t.Fatalf("run %s is %+v, want phase %s", id, r, phase)
	}
	return r
}

// sandboxCgroupFile reads file of sandbox id's cgroup in controller (v1)
// or the unified hierarchy (v2).
func sandboxCgroupFile(t *testing.T, d *daemon, controller, id, file string) string {
	t.Helper()
	for _, dir := range []string{filepath.Join("/sys/fs/cgroup", controller, d.cgroup(), id), filepath.Join("/sys/fs/cgroup", d.cgroup(), id)} {
		if b, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no cgroup file %s for sandbox %s under %s", file, id, d.cgroup())
	return ""
}

// frozen says whether sandbox id's cgroup is frozen (v1 freezer or v2).
func frozen(t *testing.T, d *daemon, id string) bool {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", d.cgroup(), id, "freezer.state")); err == nil {
		return strings.TrimSpace(string(b)) != "THAWED"
	}
	return sandboxCgroupFile(t, d, "", id, "cgroup.freeze") != "0"
}

// testForkBomb: a unit forking without end stops at its grant's pids
// limit (64 here) inside its own cgroup, and its close kills every copy.
func testForkBomb(t *testing.T, d *daemon) {
	const id = "fork-bomb"
	const pids = 64
	// At most 512 forks: on a host without the limit, the test must
	// show that without harming it.
	startHostile(t, d, id, "fork-bomb", []string{"HOSTILE_FORKS=512"}, unit.Grants{Limits: unit.Limits{Pids: pids}})
	said := waitSaid(t, d, id, "fork-bomb", "forked ")
	t.Logf("the unit: %s", said)
	if !strings.Contains(said, "fork failed") {
		t.Fatalf("the unit forked without a failure (%s): no pids limit holds it", said)
	}
	if max := sandboxCgroupFile(t, d, "pids", id, "pids.max"); max != strconv.Itoa(pids) {
		t.Fatalf("pids.max %s, want %d", max, pids)
	}
	cur, err := strconv.Atoi(sandboxCgroupFile(t, d, "pids", id, "pids.current"))
	if err != nil || cur > pids {
		t.Fatalf("pids.current %d (%v), want at most %d", cur, err, pids)
	}
	stillServing(t, d, id, "executing")
	if _, err := d.c.Close(context.Background(), id, "e2e: fork bomb held"); err != nil {
		t.Fatal(err)
	}
	if n := d.cgroupProcs(); n != 0 {
		t.Fatalf("%d processes left in the sandboxes' cgroups after the close", n)
	}
}

// testSubmountWrite: a writable tmpfs mounted below a read-only grant
// stays read-only in the sandbox (recursive read-only).
func testSubmountWrite(t *testing.T, d *daemon) {
	const id = "submount-write"
	grant := t.TempDir()
	sub := filepath.Join(grant, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(sub, syscall.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	startHostile(t, d, id, "submount-write", []string{"HOSTILE_PATH=/grant/sub/pwned"},
		unit.Grants{ReadOnly: []unit.Mount{{Source: grant, Target: "/grant"}}})
	said := waitSaid(t, d, id, "submount-write", "wr")
	t.Logf("the unit: %s", said)
	if _, err := os.Stat(filepath.Join(sub, "pwned")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the unit wrote into the host's mount below its read-only grant (stat: %v)", err)
	}
	if !strings.Contains(said, "read-only file system") {
		t.Fatalf("the write was not refused as read-only: %s", said)
	}
	stillServing(t, d, id, "executing")
}

// testSocketBelowGrant: a host daemon's unix socket below a read-only
// grant cannot be connected to (finding 7): the grant is an overlay of the
// host directory, and a socket is found by the inode it was bound to.
func testSocketBelowGrant(t *testing.T, d *daemon) {
	const id = "socket-below-grant"
	grant := t.TempDir()
	if err := os.Mkdir(filepath.Join(grant, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(grant, "run", "daemon.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	startHostile(t, d, id, "socket-connect", []string{"HOSTILE_PATH=/grant/run/daemon.sock"},
		unit.Grants{ReadOnly: []unit.Mount{{Source: grant, Target: "/grant"}}})
	said := waitSaid(t, d, id, "socket-connect", "conn")
	t.Logf("the unit: %s", said)
	select {
	case <-accepted:
		t.Fatal("the host's socket below the grant accepted the unit's connection")
	default:
	}
	if !strings.HasPrefix(said, "connect /grant/run/daemon.sock refused") {
		t.Fatalf("the unit's connect was not refused: %s", said)
	}
	stillServing(t, d, id, "executing")
}

// testMountSources: a grant set asking for the host's root, /proc,
// /sys, /dev, the daemon's state directory or a directory holding it, a
// symlink to the root, or a socket is refused at start (bad_request),
// and no run is made.
func testMountSources(t *testing.T, d *daemon) {
	dir := t.TempDir()
	link := filepath.Join(dir, "root-link")
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i, src := range []string{"/", "/proc", "/proc/1/root", "/sys", "/dev", d.state, filepath.Join(d.state, "store"), d.root, link, sock} {
		id := fmt.Sprintf("mount-source-%d", i)
		_, err := d.c.Start(context.Background(), api.RunRequest{ID: id,
			Unit:   unit.Spec{Image: hostileImage, Env: []string{"HOSTILE=idle"}},
			Grants: unit.Grants{Network: unit.NoNetwork, ReadOnly: []unit.Mount{{Source: src, Target: "/grant"}}}})
		if err == nil {
			closeAtEnd(t, d, id)
		}
		ae := apiError(t, err, "bad_request")
		t.Logf("%s refused: %s", src, ae.Message)
		if _, err := d.run(context.Background(), id); err == nil {
			t.Fatalf("a refused start left run %s", id)
		}
	}
	if _, err := d.c.Host(context.Background()); err != nil {
		t.Fatalf("the daemon no longer serves: %v", err)
	}
}

// diskUsage is the space the files under dir take on disk.
func diskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := e.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// testSparseFile: a sparse file of 1 GiB in the unit's root, under a
// grant whose snapshots may hold 64 MiB, makes its park refused before
// the rw layer is written: the record is unchanged, the unit runs on,
// and the store has not grown by the file's logical size.
func testSparseFile(t *testing.T, d *daemon) {
	const id = "sparse-file"
	startHostile(t, d, id, "sparse-file", []string{"HOSTILE_SIZE=" + strconv.Itoa(1<<30)},
		unit.Grants{Limits: unit.Limits{SnapshotBytes: 64 << 20}})
	said := waitSaid(t, d, id, "sparse-file", "made ")
	t.Logf("the unit: %s", said)
	store := filepath.Join(d.state, "store")
	before := diskUsage(store)
	was := stillServing(t, d, id, "executing")
	_, err := d.c.Park(context.Background(), id)
	ae := apiError(t, err, api.CodeNoSpace)
	t.Logf("park refused: %s", ae.Message)
	unchanged(t, d, id, was)
	if was.Status != "running" {
		t.Fatalf("run %+v: the unit does not run on", was)
	}
	if grown := diskUsage(store) - before; grown > 32<<20 {
		t.Fatalf("the store grew by %d bytes for a refused park", grown)
	}
	if frozen(t, d, id) {
		t.Fatal("the unit is left frozen after the refused park")
	}
}

// testLogFlood: 16 MiB on stderr under a grant of 1 MiB of output per
// stream leaves a stderr file of 1 MiB and a closing note of the cap, and
// the interval's journal counts what was discarded. The unit says it is
// done on stdout, which may overtake the last of its stderr still in the
// pipes between it and the daemon (about 1 MiB was seen under load): the
// flood is large enough that at least 2 MiB were discarded by then.
func testLogFlood(t *testing.T, d *daemon) {
	const id = "log-flood"
	const capBytes = 1 << 20
	startHostile(t, d, id, "log-flood", []string{"HOSTILE_BYTES=" + strconv.Itoa(16<<20)},
		unit.Grants{Limits: unit.Limits{LogBytes: capBytes}})
	said := waitSaid(t, d, id, "log-flood", "flooded ")
	t.Logf("the unit: %s", said)
	stderr := filepath.Join(filepath.Dir(d.stdout(id)), "stderr")
	b, err := os.ReadFile(stderr)
	if err != nil {
		t.Fatal(err)
	}
	const note = "runrecordd: stderr reached its limit of 1048576 bytes"
	if len(b) > capBytes+256 {
		t.Fatalf("stderr holds %d bytes under a limit of %d", len(b), capBytes)
	}
	tail := string(b[max(0, len(b)-256):])
	if !strings.Contains(tail, note) {
		t.Fatalf("stderr (%d bytes) does not end with the note %q: ends %q", len(b), note, tail)
	}
	stillServing(t, d, id, "executing")
	// The interval's journal says how much was discarded.
	if _, err := d.c.Close(context.Background(), id, "e2e: log flood"); err != nil {
		t.Fatal(err)
	}
	s := mustShow(t, d, id)
	var discarded struct {
		Stdout uint64 `json:"stdout_bytes"`
		Stderr uint64 `json:"stderr_bytes"`
		Limit  uint64 `json:"limit_bytes"`
	}
	_, j := d.journal(t, s.Segments[0])
	if !lifecycleEntry(j, "output-discarded", &discarded) || discarded.Stderr < 2<<20 || discarded.Limit != capBytes {
		t.Fatalf("the interval's journal does not record the discarded stderr: %+v", discarded)
	}
}

// testPrivileges: the unit runs under the default seccomp profile, with
// no_new_privs, with containerd's default capabilities only, and, its
// grant set naming none, under the default memory and pids limits.
func testPrivileges(t *testing.T, d *daemon) {
	const id = "privileges"
	startHostile(t, d, id, "privileges", nil, unit.Grants{})
	get := func(key string) string { return strings.TrimPrefix(waitSaid(t, d, id, "privileges", key+"="), key+"=") }
	// containerd's default set (oci.populateDefaultUnixSpec).
	var want uint64
	for _, c := range []int{0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31} {
		want |= 1 << c
	}
	for _, key := range []string{"CapEff", "CapBnd"} {
		v, err := strconv.ParseUint(get(key), 16, 64)
		if err != nil || v != want {
			t.Errorf("%s %x (%v), want containerd's default set %x", key, v, err, want)
		}
	}
	if v := get("NoNewPrivs"); v != "1" {
		t.Errorf("NoNewPrivs %s, want 1", v)
	}
	if v := get("Seccomp"); v != "2" {
		t.Errorf("Seccomp %s, want 2 (a filter)", v)
	}
	t.Logf("uid map: %s", get("uid_map"))
	// A grant set without memory or pids: the defaults, never unlimited.
	mem := ""
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", d.cgroup(), id)); err == nil {
		mem = sandboxCgroupFile(t, d, "memory", id, "memory.limit_in_bytes")
	} else {
		mem = sandboxCgroupFile(t, d, "", id, "memory.max")
	}
	if mem != strconv.Itoa(1<<30) {
		t.Errorf("memory limit %s, want the default 1 GiB", mem)
	}
	if pids := sandboxCgroupFile(t, d, "pids", id, "pids.max"); pids != strconv.Itoa(int(unit.DefaultLimits.Pids)) {
		t.Errorf("pids.max %s, want the default %d", pids, unit.DefaultLimits.Pids)
	}
	stillServing(t, d, id, "executing")
}
