//go:build linux

package executor_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/ociarchive"
	"github.com/runrecordd/runrecordd/pkg/unit"

	"github.com/opencontainers/image-spec/identity"
)

// The tests run real containerd, runc and CRIU as root. They do not skip
// on a host that lacks them: TestMain fails loudly, because CI runs as root
// with all of it installed. RUNRECORDD_SKIP_PRIVILEGED=1 skips them, saying
// so, for a developer machine without root.
const skipEnv = "RUNRECORDD_SKIP_PRIVILEGED"

var (
	skipReason string               // set when RUNRECORDD_SKIP_PRIVILEGED=1
	client     *executor.Client     // the shared executor on a private containerd
	daemon     *executor.Containerd // that containerd
	oracle     executor.Image       // the oracle unit's image
)

func TestMain(m *testing.M) {
	pageserver.MaybeRun() // TestRestoreLazyServed's page server: this binary again
	os.Exit(mainTest(m))
}

func mainTest(m *testing.M) int {
	if os.Getenv(skipEnv) == "1" {
		skipReason = skipEnv + "=1: skipping the executor's privileged tests (real containerd, runc, CRIU as root)"
		fmt.Fprintln(os.Stderr, "executor:", skipReason)
		return m.Run()
	}
	if err := preflight(); err != nil {
		fmt.Fprintf(os.Stderr, "\n*** executor tests need root, containerd, runc and a CRIU whose `criu check` passes:\n*** %v\n*** run deploy/setup.sh as root, or set %s=1 to skip these tests.\n\n", err, skipEnv)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A short path: the daemon's socket lives under it.
	dir, err := os.MkdirTemp("", "rrx-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := executor.StartContainerd(ctx, dir, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	daemon = d
	code := func() int {
		cfg := d.Config()
		cfg.Logger = log
		// One cgroup parent for every run of this package's tests, removed
		// at the end, rather than one per temporary directory.
		cfg.CgroupParent = testCgroup
		client, err = executor.Connect(ctx, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer client.Close()
		oracle, err = buildImage(ctx, dir, "./units/oracle", "runrecordd.test/oracle:1")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		code := m.Run()
		// Every test destroys what it made; anything left is a failure.
		if ids, err := client.List(context.Background()); err != nil || len(ids) > 0 {
			fmt.Fprintf(os.Stderr, "executor: sandboxes left behind: %v %v\n", ids, err)
			code = 1
		}
		return code
	}()
	if err := d.Stop(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	removeCgroup(testCgroup)
	if code == 0 {
		// On failure the directory stays, with containerd.log and CRIU logs.
		_ = exec.Command("umount", "-R", filepath.Join(dir, "state")).Run()
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintln(os.Stderr, "executor: test state kept in", dir)
	}
	return code
}

const testCgroup = "/runrecordd-test-executor"

// removeCgroup removes the (empty) cgroup at path from every hierarchy,
// v1 or v2.
func removeCgroup(path string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", path))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", path))
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}

func preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	for _, bin := range []string{"containerd", "runc", "iptables-restore", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			return err
		}
	}
	return criu.Check(context.Background(), "")
}

// buildImage builds the unit at pkg (relative to the module root) into an
// OCI archive and imports it.
func buildImage(ctx context.Context, dir, pkg, name string) (executor.Image, error) {
	bin, err := ociarchive.GoBinary(ctx, "../..", pkg)
	if err != nil {
		return executor.Image{}, err
	}
	path := filepath.Join(dir, filepath.Base(pkg)+".tar")
	d, err := ociarchive.WriteFile(path, ociarchive.Unit(name, bin))
	if err != nil {
		return executor.Image{}, err
	}
	img, err := client.ImportFile(ctx, path, name)
	if err != nil {
		return executor.Image{}, err
	}
	if img.Digest != d.Manifest.String() {
		return executor.Image{}, fmt.Errorf("imported %s has manifest %s, the archive %s", name, img.Digest, d.Manifest)
	}
	return img, nil
}

func privileged(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// line is the oracle's report (units/oracle).
type line struct {
	Counter    uint64 `json:"counter"`
	Checksum   string `json:"checksum"`
	Verify     string `json:"verify"`
	VerifiedAt uint64 `json:"verified_at"`
	FileOffset int64  `json:"file_offset"`
	FileOK     bool   `json:"file_ok"`
	PipeSeq    uint64 `json:"pipe_seq"`
	LoUp       bool   `json:"lo_up"`
	Pid        int    `json:"pid"`
	ChildPid   int    `json:"child_pid"`
	BufAddr    uint64 `json:"buf_addr"`
	// UffdToggles and UffdRefs, with UFFD_REF_ON_USR2 set.
	UffdToggles uint64 `json:"uffd_toggles"`
	UffdRefs    int    `json:"uffd_refs"`
	StartTime   int64  `json:"start_time"`
	Error       string `json:"error"`
}

// output reads the complete lines of the oracle's stdout file.
func output(t *testing.T, path string) []line {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	// Only whole lines: the last one may be half-written.
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var out []line
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("oracle line %q: %v", sc.Bytes(), err)
		}
		if l.Error != "" {
			t.Fatalf("oracle reports a broken invariant: %s", l.Error)
		}
		out = append(out, l)
	}
	return out
}

// waitLines waits until the oracle's stdout holds a line satisfying ok,
// and returns all lines then.
func waitLines(t *testing.T, path string, what string, ok func([]line) bool) []line {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ls := output(t, path)
		if ok(ls) {
			return ls
		}
		if time.Now().After(deadline) {
			stderr, _ := os.ReadFile(strings.TrimSuffix(path, ".out") + ".err")
			t.Fatalf("waiting for %s: %d lines; stderr: %s", what, len(ls), stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func outputs(t *testing.T, name string) executor.Output {
	dir := t.TempDir()
	return executor.Output{Stdout: filepath.Join(dir, name+".out"), Stderr: filepath.Join(dir, name+".err")}
}

func mustStart(t *testing.T, id string, spec executor.Spec, out executor.Output) *executor.Sandbox {
	t.Helper()
	s, err := client.Start(context.Background(), id, spec, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	return s
}

func destroy(t *testing.T, s *executor.Sandbox) {
	t.Helper()
	if err := s.Destroy(context.Background()); err != nil {
		t.Error(err)
	}
}

func oracleSpec() executor.Spec {
	return executor.Spec{
		Image:       oracle.Name,
		ImageDigest: oracle.Digest,
		MemoryBytes: 256 << 20,
		MilliCPU:    1000,
		Network:     unit.NoNetwork,
	}
}

func last(ls []line) line { return ls[len(ls)-1] }

// The embedded daemon's configuration is in the format of the containerd
// it runs: one it had to migrate (an older version) says so in its log at
// every start, and one it could not read would not have started.
func TestDaemonConfigCurrent(t *testing.T) {
	privileged(t)
	b, err := os.ReadFile(filepath.Join(daemon.Dir(), "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Configuration migrated") {
			t.Errorf("containerd.log: %s", l)
		}
	}
}

func TestRunOracle(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	for _, network := range []unit.Network{unit.NoNetwork, unit.Loopback} {
		t.Run(network.String(), func(t *testing.T) {
			out := outputs(t, "oracle")
			spec := oracleSpec()
			spec.Network = network
			s := mustStart(t, "run-"+network.String(), spec, out)
			ls := waitLines(t, out.Stdout, "five lines", func(ls []line) bool { return len(ls) >= 5 })
			first := ls[0]
			if first.Pid != 1 || first.Checksum == "" || first.Checksum != first.Verify || !first.FileOK {
				t.Fatalf("first line %+v", first)
			}
			for i, l := range ls {
				if l.Counter != uint64(i+1) || l.PipeSeq != uint64(i) || l.FileOffset != 4096+8*int64(i+1) || l.StartTime != first.StartTime {
					t.Fatalf("line %d: %+v", i, l)
				}
			}
			if want := network == unit.Loopback; first.LoUp != want {
				t.Fatalf("network %s: lo up = %v", network, first.LoUp)
			}
			u, err := s.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if u.CPUNanos == 0 || u.MemoryBytes < 64<<20 || u.Pids < 2 {
				t.Fatalf("stats %+v: want CPU time, ≥ 64 MiB, ≥ 2 pids", u)
			}
		})
	}
}

func TestImageMismatch(t *testing.T) {
	privileged(t)
	spec := oracleSpec()
	spec.ImageDigest = "sha256:" + strings.Repeat("0", 64)
	_, err := client.Start(context.Background(), "mismatch", spec, executor.Output{})
	if !errors.Is(err, executor.ErrImageMismatch) {
		t.Fatalf("err = %v, want ErrImageMismatch", err)
	}
}

// TestStartFails: a process that cannot start fails Start and leaves
// nothing behind (TestMain checks that no sandbox is left).
func TestStartFails(t *testing.T) {
	privileged(t)
	spec := oracleSpec()
	spec.Args = []string{"/no/such/program"}
	if s, err := client.Start(context.Background(), "fails", spec, executor.Output{}); err == nil {
		destroy(t, s)
		t.Fatal("started a program that does not exist")
	}
	if _, err := client.Load(context.Background(), "fails"); !errors.Is(err, executor.ErrNotFound) {
		t.Fatalf("after a failed start: %v, want ErrNotFound", err)
	}
}

// TestCheckpointRestore parks the oracle twice in a row: each time the
// restored process reports the same buffer checksum (recomputed after the
// restore), the same start time and pids, and a counter, file offset and
// pipe sequence that go on from where they were.
func TestCheckpointRestore(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "park"
	s := mustStart(t, id, spec, out)
	ls := waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt >= 10 })
	before := last(ls)

	for round := 1; round <= 2; round++ {
		dir := t.TempDir()
		cp := executor.Checkpoint{ImageDir: filepath.Join(dir, "images"), Rootfs: filepath.Join(dir, "rootfs.tar")}
		st, err := s.Checkpoint(ctx, cp)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: checkpoint %v (dump %v, diff %v; CRIU frozen %v, memdump %v, memwrite %v), %d pages written, image %d B, rootfs %d B",
			round, st.Total, st.Dump, st.Diff, st.Frozen, st.MemDump, st.MemWrite, st.PagesWritten, st.ImageBytes, st.RootfsBytes)
		if st.PagesWritten < 64<<20/4096 || st.ImageBytes < 64<<20 || st.RootfsBytes == 0 {
			t.Fatalf("checkpoint stats %+v: want the 64 MiB buffer and the rw layer", st)
		}
		if status, err := s.Status(ctx); err != nil || status != "stopped" {
			t.Fatalf("after checkpoint: status %q, %v", status, err)
		}
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		// Destroy has drained the task's output: this is the last line
		// the dumped process wrote.
		atDump := last(output(t, out.Stdout))
		images := listDir(t, cp.ImageDir)

		var rst executor.RestoreStats
		s, rst, err = client.Restore(ctx, id, spec, cp, out)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { destroy(t, s) })
		t.Logf("round %d: restore %v (rootfs %v, task %v; CRIU forking %v, restore %v), %d pages",
			round, rst.Total, rst.Rootfs, rst.Task, rst.Forking, rst.Restore, rst.PagesRestored)
		if got := listDir(t, cp.ImageDir); got != images {
			t.Fatalf("restore changed the image directory: %s, was %s", got, images)
		}

		ls := waitLines(t, out.Stdout, "a line verified after the restore", func(ls []line) bool {
			return last(ls).VerifiedAt > atDump.Counter
		})
		// The output of every incarnation together is one run: counters
		// 1, 2, 3, … with no gap and no repeat, one start time, one pair of
		// pids, one buffer checksum (recomputed by the restored process).
		for i, l := range ls {
			if l.Counter != uint64(i+1) || l.Checksum != before.Checksum || l.Verify != before.Checksum || !l.FileOK ||
				l.StartTime != before.StartTime || l.Pid != before.Pid || l.ChildPid != before.ChildPid ||
				l.FileOffset != 4096+8*int64(l.Counter) || l.PipeSeq != l.Counter-1 || l.LoUp {
				t.Fatalf("round %d: line %d %+v; first %+v", round, i, l, before)
			}
		}
	}
}

// TestCheckpointKeep dumps with Keep: the task stays frozen, and resuming
// it goes on in the same process.
func TestCheckpointKeep(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	s := mustStart(t, "keep", oracleSpec(), out)
	waitLines(t, out.Stdout, "two lines", func(ls []line) bool { return len(ls) >= 2 })
	dir := t.TempDir()
	if _, err := s.Checkpoint(ctx, executor.Checkpoint{ImageDir: filepath.Join(dir, "images"), Rootfs: filepath.Join(dir, "rootfs.tar"), Keep: true}); err != nil {
		t.Fatal(err)
	}
	if status, err := s.Status(ctx); err != nil || status != "paused" {
		t.Fatalf("after Keep checkpoint: status %q, %v", status, err)
	}
	time.Sleep(100 * time.Millisecond) // a line written just before the freeze may still be in flight
	n := len(output(t, out.Stdout))
	time.Sleep(300 * time.Millisecond)
	if m := len(output(t, out.Stdout)); m != n {
		t.Fatalf("frozen oracle printed %d lines", m-n)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	waitLines(t, out.Stdout, "lines after resume", func(ls []line) bool { return len(ls) >= n+2 })
}

// TestWritableMount runs the oracle with its file on a writable bind mount
// (as a transcript directory is) across a checkpoint and restore.
func TestWritableMount(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	host := t.TempDir()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	spec.Env = []string{"OUT_FILE=/transcript/oracle.dat"}
	spec.Mounts = []executor.Mount{{Source: host, Target: "/transcript", Writable: true}}
	const id = "mount"
	s := mustStart(t, id, spec, out)
	waitLines(t, out.Stdout, "three lines", func(ls []line) bool { return len(ls) >= 3 })
	cp, atDump := checkpointAway(t, s, out)
	if fi, err := os.Stat(filepath.Join(host, "oracle.dat")); err != nil || fi.Size() != atDump.FileOffset {
		t.Fatalf("host file: %v, %v; want %d bytes", fi, err, atDump.FileOffset)
	}
	s, _, err := client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	ls := waitLines(t, out.Stdout, "a line verified after the restore", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > atDump.Counter
	})
	if l := last(ls); l.StartTime != atDump.StartTime || !l.FileOK {
		t.Fatalf("after restore %+v, before %+v", l, atDump)
	}
}

// mountOpts maps each mount point under target in process pid's mount
// namespace to its per-mount options (mountinfo's sixth field).
func mountOpts(t *testing.T, pid uint32, target string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && (f[4] == target || strings.HasPrefix(f[4], target+"/")) {
			out[f[4]] = f[5]
		}
	}
	return out
}

// TestReadOnlyMountRecursive: a read-only grant is one read-only, nosuid
// and nodev mount (an overlay of the host directory): a writable tmpfs the
// host has below its source is not in the sandbox, in the started sandbox
// and again in the restored one.
func TestReadOnlyMountRecursive(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	host := t.TempDir()
	sub := filepath.Join(host, "sub")
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
	out := outputs(t, "oracle")
	spec := oracleSpec()
	spec.Mounts = []executor.Mount{{Source: host, Target: "/grant"}}
	const id = "ro-mount"
	s := mustStart(t, id, spec, out)
	check := func(when string, pid uint32) {
		t.Helper()
		got := mountOpts(t, pid, "/grant")
		// The grant is a read-only overlay of the host directory: one
		// file system, the host's tmpfs below it not in the sandbox.
		if len(got) != 1 || got["/grant"] == "" {
			t.Fatalf("%s: mounts under /grant %v, want /grant alone", when, got)
		}
		for mp, opts := range got {
			o := "," + opts + ","
			if !strings.Contains(o, ",ro,") || !strings.Contains(o, ",nosuid,") || !strings.Contains(o, ",nodev,") {
				t.Errorf("%s: %s mounted %s, want ro,nosuid,nodev", when, mp, opts)
			}
		}
		t.Logf("%s: %v", when, got)
	}
	waitLines(t, out.Stdout, "a line", func(ls []line) bool { return len(ls) >= 1 })
	check("started", s.Pid())
	cp, atDump := checkpointAway(t, s, out)
	s, _, err := client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	waitLines(t, out.Stdout, "a line after the restore", func(ls []line) bool { return last(ls).Counter > atDump.Counter })
	check("restored", s.Pid())
}

// TestMountSourceRefused: a mount whose source is, or resolves to, a path
// no grant may have is refused before anything is made.
func TestMountSourceRefused(t *testing.T) {
	privileged(t)
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/proc/self", link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"/", "/proc", "/dev/null", "/run", link, fifo, client.Config().StateDir, filepath.Dir(client.Config().StateDir), "/nonexistent-rr"} {
		spec := oracleSpec()
		spec.Mounts = []executor.Mount{{Source: src, Target: "/grant"}}
		s, err := client.Start(context.Background(), "refused", spec, outputs(t, "refused"))
		if err == nil {
			destroy(t, s)
		}
		if !errors.Is(err, executor.ErrInvalid) {
			t.Fatalf("mount of %s: %v, want ErrInvalid", src, err)
		}
	}
	if ids, err := client.List(context.Background()); err != nil || slices.Contains(ids, "refused") {
		t.Fatalf("a refused start left a container: %v %v", ids, err)
	}
}

// TestLoad reattaches to a running sandbox from a second client, as a
// restarted daemon does.
func TestLoad(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	s := mustStart(t, "load", oracleSpec(), out)
	waitLines(t, out.Stdout, "a line", func(ls []line) bool { return len(ls) >= 1 })
	other, err := executor.Connect(ctx, client.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	got, err := other.Load(ctx, "load")
	if err != nil {
		t.Fatal(err)
	}
	if got.Pid() != s.Pid() {
		t.Fatalf("loaded pid %d, started %d", got.Pid(), s.Pid())
	}
	if _, err := got.Stats(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestVersions(t *testing.T) {
	privileged(t)
	v, err := client.Versions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v.Containerd == "" || v.Runc == "" || !strings.HasPrefix(v.CRIU, "4.") && !strings.HasPrefix(v.CRIU, "5.") {
		t.Fatalf("versions %+v", v)
	}
	t.Logf("%+v", v)
}

// listDir names and sizes the files of dir, as one string.
func listDir(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%d ", e.Name(), fi.Size())
	}
	return b.String()
}

// TestContainerdRestart kills an embedded daemon and sees the supervisor
// bring it back on the same socket.
func TestContainerdRestart(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "rrx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d, err := executor.StartContainerd(ctx, dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	if _, err := executor.StartContainerd(ctx, dir, nil); !errors.Is(err, executor.ErrExists) {
		t.Fatalf("second daemon on one directory: %v, want ErrExists", err)
	}
	c, err := executor.Connect(ctx, d.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid := d.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if d.Restarts() == 1 && d.Pid() != 0 && d.Pid() != pid {
			if _, err := c.Versions(ctx); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not back: restarts %d, pid %d (was %d)", d.Restarts(), d.Pid(), pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestProbe dumps and restores a process and a container on this host, as
// the daemon does at start: on the machines CI runs on, image parks work.
func TestProbe(t *testing.T) {
	privileged(t)
	p := client.Probe(context.Background(), time.Minute)
	if !p.OK || p.Reason != "" || p.Took <= 0 {
		t.Fatalf("probe %+v", p)
	}
	t.Logf("probe took %v; notes %q", p.Took, p.Notes)
	if ids, err := client.List(context.Background()); err != nil || len(ids) > 0 {
		t.Fatalf("the probe left sandboxes in the runs' namespace: %v %v", ids, err)
	}
}

// TestProbeHangingCRIU probes with a criu that never answers: the probe
// fails at its deadline, says so, and leaves no process behind.
func TestProbeHangingCRIU(t *testing.T) {
	privileged(t)
	dir := t.TempDir()
	standIn := filepath.Join(dir, "criu")
	// exec: the stand-in is the process the probe must kill. Its sleep
	// lasts 3599 s, not the 3600 of test/e2e's hanging stand-ins: `make
	// test` runs both packages at once, and each looks for its own.
	if err := os.WriteFile(standIn, []byte("#!/bin/sh\nexec sleep 3599\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := client.Config()
	cfg.CRIU = standIn
	c, err := executor.Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	p := c.Probe(context.Background(), 2*time.Second)
	took := time.Since(start)
	if p.OK || !strings.Contains(p.Reason, "did not finish within 2s") {
		t.Fatalf("probe with a hanging criu: %+v", p)
	}
	if took > 20*time.Second {
		t.Fatalf("the probe took %v with a 2s deadline", took)
	}
	out, _ := exec.Command("pgrep", "-f", "^sleep 3599$").Output()
	if len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("the stand-in criu is still running: pids %s", out)
	}
}

// checkpointAway checkpoints s into a new directory and destroys it, as a
// park does; it returns the checkpoint and the unit's last line, drained
// by the destroy.
func checkpointAway(t *testing.T, s *executor.Sandbox, out executor.Output) (executor.Checkpoint, line) {
	t.Helper()
	cp := parkAway(t, s)
	return cp, last(output(t, out.Stdout))
}

// parkAway checkpoints s into a new directory and destroys it.
func parkAway(t *testing.T, s *executor.Sandbox) executor.Checkpoint {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	cp := executor.Checkpoint{ImageDir: filepath.Join(dir, "images"), Rootfs: filepath.Join(dir, "rootfs.tar")}
	if _, err := s.Checkpoint(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	return cp
}

// TestStartOverLeftSnapshot: a snapshot under a sandbox's id with no
// container — what a create cut short by a daemon killed in it leaves,
// kept by its lease — does not refuse the next create of that id.
func TestStartOverLeftSnapshot(t *testing.T) {
	privileged(t)
	ctx := client.NamespacedForTest(context.Background())
	spec := oracleSpec()
	mustStart(t, "left-snapshot-first", spec, executor.Output{}) // the image unpacked
	img, err := client.ContainerdForTest().GetImage(ctx, spec.Image)
	if err != nil {
		t.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sn := client.ContainerdForTest().SnapshotService(executor.Snapshotter)
	if _, err := sn.Prepare(ctx, "left-snapshot", identity.ChainID(diffIDs).String()); err != nil {
		t.Fatal(err)
	}
	mustStart(t, "left-snapshot", spec, executor.Output{})
}
