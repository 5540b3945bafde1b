//go:build linux

package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// daemon is one `runrecordd serve` process on its own state directory,
// with its embedded containerd.
type daemon struct {
	name   string
	root   string // os.MkdirTemp("", "rre-"): short, for the sockets under it
	state  string // root/state: the --state-dir
	log    string // root/daemon.log: the daemon's stdout and stderr, every start
	socket string
	c      *api.Client
	// env is added to the environment of every start while set (the
	// crash tests arm a failpoint with it).
	env []string
	// flags are added to `serve` at every start.
	flags []string
	// bin is the runrecordd binary it runs (another version's); empty,
	// the one under test.
	bin string
	// stopDefault: the daemon stops under its default policy (park).
	// Unset, every start adds --on-stop=leave (unless flags name a
	// policy), for the tests that stop a daemon to see it reattach.
	stopDefault bool
	// fleet: the daemon serves in a fleet, where a run it holds parked
	// may be another host's to close (its close is refused not_owner).
	fleet bool

	cmd  *exec.Cmd
	done chan error // cmd.Wait's result, once
}

// allDaemons are every daemon the tests made, for the suite's final check
// that none left anything behind; daemonsMu guards it (tests that run in
// parallel, parallel_test.go, add to it at once).
var (
	daemonsMu  sync.Mutex
	allDaemons []*daemon
)

// newDaemon makes a state directory and starts a daemon on it; opts set
// its env and flags before the first start.
func newDaemon(name string, opts ...func(*daemon)) (*daemon, error) {
	root, err := os.MkdirTemp("", "rre-")
	if err != nil {
		return nil, err
	}
	// Searchable, not listable: runc sets a sandbox's rootfs up, below
	// the state directory, as its run's user-namespace range's root.
	if err := os.Chmod(root, 0o711); err != nil {
		return nil, err
	}
	d := &daemon{name: name, root: root, state: filepath.Join(root, "state"), log: filepath.Join(root, "daemon.log")}
	d.socket = filepath.Join(d.state, "runrecordd.sock")
	d.c = api.NewClient(d.socket)
	for _, o := range opts {
		o(d)
	}
	daemonsMu.Lock()
	allDaemons = append(allDaemons, d)
	daemonsMu.Unlock()
	if err := d.start(); err != nil {
		return d, err
	}
	return d, nil
}

// mustDaemon starts a daemon for t alone. Its cleanup verifies every run
// from genesis, closes them all, stops the daemon and checks that it
// exits 0 and leaves nothing running.
func mustDaemon(t *testing.T, name string, opts ...func(*daemon)) *daemon {
	t.Helper()
	d, err := newDaemon(name, opts...)
	if d != nil {
		t.Cleanup(func() {
			if err := d.shutdown(t.Failed()); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// shared returns the daemon the tests share, starting it for the first.
// t's cleanup verifies every run on it from genesis.
func shared(t *testing.T) *daemon {
	t.Helper()
	if sharedDaemon == nil {
		// It keeps no warm sandboxes: its transcript tests check that
		// nothing of a parked run is resident (warm_test.go runs
		// daemons with the pool, which every other daemon has).
		d, err := newDaemon("shared", func(d *daemon) { d.flags = []string{"--warm-pool", "0"} })
		if d != nil {
			sharedDaemon = d
		}
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := importImage(ctx, d, oracleArchive, oracleImage); err != nil {
			t.Fatal(err)
		}
	}
	d := sharedDaemon
	t.Cleanup(func() {
		if !d.running() {
			t.Errorf("%s daemon is not running after the test", d.name)
			return
		}
		if err := d.verifyAll(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return d
}

// start starts the daemon and waits until its API answers.
func (d *daemon) start() error {
	if d.running() {
		return fmt.Errorf("%s daemon: already running", d.name)
	}
	logf, err := os.OpenFile(d.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== e2e: starting %s daemon at %s\n", d.name, time.Now().Format(time.RFC3339Nano))
	args := append([]string{"serve", "--state-dir", d.state, "--log-level", "debug"}, d.flags...)
	if !d.stopDefault && !slices.ContainsFunc(d.flags, func(f string) bool { return strings.HasPrefix(f, "--on-stop") }) {
		args = append(args, "--on-stop=leave")
	}
	cmd := exec.Command(d.binary(), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// systemd's variables are a test's to give (asUnit): one run under a
	// systemd service must not pass its own on.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"NOTIFY_SOCKET", "INVOCATION_ID", "WATCHDOG_USEC", "WATCHDOG_PID"}, name)
	})
	if d.env != nil {
		cmd.Env = append(cmd.Env, d.env...)
		fmt.Fprintf(logf, "=== e2e: with %s\n", strings.Join(d.env, " "))
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s daemon: %w", d.name, err)
	}
	d.cmd, d.done = cmd, make(chan error, 1)
	go func() { d.done <- cmd.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := d.c.Host(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case werr := <-d.done:
			d.cmd = nil
			return fmt.Errorf("%s daemon exited while starting (%v); log %s:\n%s", d.name, werr, d.log, d.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s daemon: no answer on %s after 2m: %v; log %s:\n%s", d.name, d.socket, err, d.log, d.logTail())
		}
	}
}

func (d *daemon) running() bool { return d.cmd != nil }

// binary is the runrecordd binary d runs.
func (d *daemon) binary() string {
	if d.bin != "" {
		return d.bin
	}
	return daemonBinary
}

// stopTimeout bounds a graceful stop: a daemon with nothing to do exits in
// well under a second.
const stopTimeout = 20 * time.Second

// stop sends SIGTERM and waits for the daemon to exit; anything but exit
// status 0 within stopTimeout is an error. The daemon is stopped either way
// (killed when it would not stop).
func (d *daemon) stop() error {
	if !d.running() {
		return fmt.Errorf("%s daemon: not running", d.name)
	}
	cmd := d.cmd
	d.cmd = nil
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("%s daemon: SIGTERM: %w", d.name, err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			return fmt.Errorf("%s daemon: exit after SIGTERM: %v (want status 0); log %s:\n%s", d.name, err, d.log, d.logTail())
		}
		return nil
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-d.done
		return fmt.Errorf("%s daemon: still running %v after SIGTERM; killed it; log %s:\n%s", d.name, stopTimeout, d.log, d.logTail())
	}
}

func mustStop(t *testing.T, d *daemon) {
	t.Helper()
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
}

func mustStart(t *testing.T, d *daemon) {
	t.Helper()
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
}

// verifyAll verifies every run on the daemon from genesis, with every
// object it reaches.
func (d *daemon) verifyAll(ctx context.Context) error {
	runs, err := d.c.List(ctx, "")
	if err != nil {
		return fmt.Errorf("%s daemon: list: %w", d.name, err)
	}
	var errs []error
	for _, r := range runs {
		if err := verifyRun(ctx, d, r.ID); err != nil {
			errs = append(errs, fmt.Errorf("%s daemon: %w", d.name, err))
		}
	}
	return errors.Join(errs...)
}

// verifyRun checks that a run's record verifies from genesis and agrees
// with the run's summary.
//
// A run may move between the reads: a transcript unit a test started a
// moment ago parks itself on its await, under a loaded machine as late as
// the test's end. The summary is compared with the verdicts read before
// and after it; when those two differ the run moved, and the three are
// read again (each round is real work, not a sleep) until they agree or
// 30 s have passed. A run that holds still and disagrees fails at once.
func verifyRun(ctx context.Context, d *daemon, id string) error {
	deadline := time.Now().Add(30 * time.Second)
	v, err := verifyOK(ctx, d, id)
	if err != nil {
		return err
	}
	for {
		r, err := d.c.Show(ctx, id)
		if err != nil {
			return fmt.Errorf("run %s: show: %w", id, err)
		}
		after, err := verifyOK(ctx, d, id)
		if err != nil {
			return err
		}
		if after.Head != v.Head && time.Now().Before(deadline) {
			v = after // the run moved: read the summary again
			continue
		}
		if v.Segments != r.Run.Segments || v.Head != r.Run.Head || v.Phase != r.Run.Phase || len(r.Segments) != v.Segments {
			return fmt.Errorf("run %s: verify says %d segments, head %s, %s; the run %d (%d shown), %s, %s",
				id, v.Segments, v.Head, v.Phase, r.Run.Segments, len(r.Segments), r.Run.Head, r.Run.Phase)
		}
		return nil
	}
}

// verifyOK verifies a run from genesis, an error unless it verifies.
func verifyOK(ctx context.Context, d *daemon, id string) (api.Verify, error) {
	v, err := d.c.Verify(ctx, id)
	if err != nil {
		return v, fmt.Errorf("run %s: verify: %w", id, err)
	}
	if !v.OK {
		return v, fmt.Errorf("run %s does not verify from genesis: %+v", id, v.Error)
	}
	return v, nil
}

// closeAll closes every run not closed yet, destroying its sandbox.
func (d *daemon) closeAll(ctx context.Context) error {
	runs, err := d.c.List(ctx, "")
	if err != nil {
		return fmt.Errorf("%s daemon: list: %w", d.name, err)
	}
	var errs []error
	for _, r := range runs {
		// A handed-off run lives on another host: this one cannot close
		// it, and has no sandbox of it.
		if r.Phase == "closed" || r.HandedOff {
			continue
		}
		_, err := d.c.Close(ctx, r.ID, "e2e: test over")
		var ae *api.Error
		if d.fleet && r.Phase == "parked" && errors.As(err, &ae) && ae.Code == api.CodeNotOwner {
			continue // another host's to close; this one has no sandbox of it
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s daemon: close %s: %w", d.name, r.ID, err))
		}
	}
	return errors.Join(errs...)
}

// shutdown is the end of a daemon's life in the tests: every run verified
// from genesis, then closed and verified again; the daemon stopped with
// SIGTERM (exit status 0); no containerd or shim of its left running; its
// mounts and state directory removed — kept, with the log, when failed
// (or anything here fails), and their path printed.
func (d *daemon) shutdown(failed bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errs []error
	if !d.running() {
		// A test that failed with the daemon stopped: start it to
		// verify and close what it holds.
		if err := d.start(); err != nil {
			errs = append(errs, err)
		}
	}
	if d.running() {
		errs = append(errs, d.verifyAll(ctx), d.closeAll(ctx), d.verifyAll(ctx))
		errs = append(errs, d.stop())
	}
	errs = append(errs, d.noneLeft(), d.removeCgroups())
	err := errors.Join(errs...)
	if err != nil || failed {
		fmt.Fprintf(os.Stderr, "e2e: %s daemon's state and log kept in %s\n%s", d.name, d.root, d.lazyLogs())
		return err
	}
	d.unmount()
	if err := os.RemoveAll(d.root); err != nil {
		return fmt.Errorf("%s daemon: removing %s: %w", d.name, d.root, err)
	}
	return nil
}

// noneLeft waits briefly for the daemon's containerd and shims to be gone:
// a process whose command line names its state directory.
func (d *daemon) noneLeft() error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := d.processes()
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s daemon stopped, but processes of its state directory are left: %s", d.name, strings.Join(left, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (d *daemon) processes() []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmdline := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
		if strings.Contains(cmdline, d.state+"/") || strings.HasSuffix(cmdline, d.state) {
			out = append(out, e.Name()+": "+cmdline)
		}
	}
	return out
}

// cgroup is the cgroup parent of the daemon's sandboxes: its embedded
// containerd's (executor.Containerd.Config), named after its directory.
func (d *daemon) cgroup() string {
	sum := sha256.Sum256([]byte(filepath.Join(d.state, "containerd")))
	return "runrecordd-" + hex.EncodeToString(sum[:4])
}

// cgroupDirs are the daemon's sandbox cgroup parents in every hierarchy
// (v1 controllers, or v2) that has one.
func (d *daemon) cgroupDirs() []string {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.cgroup()))
	if fi, err := os.Stat(filepath.Join("/sys/fs/cgroup", d.cgroup())); err == nil && fi.IsDir() {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", d.cgroup()))
	}
	return dirs
}

// cgroupProcs counts the processes in the daemon's sandbox cgroups: units
// that outlived their sandbox.
func (d *daemon) cgroupProcs() int {
	n := 0
	for _, dir := range d.cgroupDirs() {
		_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.Name() == "cgroup.procs" {
				b, _ := os.ReadFile(p)
				n += len(strings.Fields(string(b)))
			}
			return nil
		})
	}
	return n
}

// removeCgroups checks that no process is left in the daemon's cgroups
// and removes them, deepest first.
func (d *daemon) removeCgroups() error {
	if n := d.cgroupProcs(); n > 0 {
		return fmt.Errorf("%s daemon: %d processes left in its sandboxes' cgroups %s", d.name, n, d.cgroup())
	}
	var errs []error
	for _, dir := range d.cgroupDirs() {
		var sub []string
		_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				sub = append(sub, p)
			}
			return nil
		})
		sort.Slice(sub, func(i, j int) bool { return len(sub[i]) > len(sub[j]) })
		for _, p := range sub {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("%s daemon: cgroup: %w", d.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmount detaches whatever is still mounted under the daemon's root
// (containerd's state directory), deepest first.
func (d *daemon) unmount() {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], d.root+"/") {
			points = append(points, fields[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// logTail is the end of the daemon's log.
func (d *daemon) logTail() string {
	b, _ := os.ReadFile(d.log)
	const n = 6000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// lazyLogs is the end of the logs of the daemon's last lazy restore of
// each run (lazy-pages', the page server's), which a failed test leaves
// behind: CI keeps only what the test printed.
func (d *daemon) lazyLogs() string {
	var sb strings.Builder
	for _, name := range []string{"lazy-pages.log", "page-server.log"} {
		logs, _ := filepath.Glob(filepath.Join(d.state, "criu", "*", "restore", name))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			lines = lines[max(0, len(lines)-25):]
			fmt.Fprintf(&sb, "e2e: the end of %s:\n%s\n", l, strings.Join(lines, "\n"))
		}
	}
	return sb.String()
}

// importImage imports an OCI archive into the daemon's containerd.
func importImage(ctx context.Context, d *daemon, archive, name string) (api.Image, error) {
	f, err := os.Open(archive)
	if err != nil {
		return api.Image{}, err
	}
	defer f.Close()
	img, err := d.c.ImportImage(ctx, f, name)
	if err != nil {
		return api.Image{}, fmt.Errorf("%s daemon: import %s as %s: %w", d.name, archive, name, err)
	}
	return img, nil
}

func mustImportImage(t *testing.T, d *daemon, archive, name, digest string) {
	t.Helper()
	img, err := importImage(context.Background(), d, archive, name)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != name || img.Digest != digest {
		t.Fatalf("imported %+v, want %s at %s", img, name, digest)
	}
}

// run is a run's summary, from the list (which reads the run's state and
// does not verify its record, so it answers for a damaged one too).
func (d *daemon) run(ctx context.Context, id string) (api.Run, error) {
	runs, err := d.c.List(ctx, "")
	if err != nil {
		return api.Run{}, fmt.Errorf("%s daemon: list: %w", d.name, err)
	}
	for _, r := range runs {
		if r.ID == id {
			return r, nil
		}
	}
	return api.Run{}, fmt.Errorf("%s daemon: no run %s", d.name, id)
}
