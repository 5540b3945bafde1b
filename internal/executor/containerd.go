//go:build linux

package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// Containerd is a containerd daemon running as a child of this process, with
// its own root, state directory, sockets and configuration under one
// directory, supervised: restarted when it dies, stopped by [Containerd.Stop]
// or when this process dies.
//
// Layout under the directory:
//
//	config.toml       the daemon's configuration, rewritten at each start
//	containerd.log    the daemon's stdout and stderr, appended; rotated at
//	                  16 MiB to containerd.log.1 (cappedLog)
//	root/             --root: content store, snapshots, metadata.db
//	state/            --state: shim bundles
//	containerd.sock   gRPC API (containerd.sock.ttrpc beside it)
//	executor/         the [Client]'s state: FIFOs, runc root, CRIU work dirs
type Containerd struct {
	dir     string
	address string
	log     *slog.Logger

	stop     chan struct{} // closed by Stop
	done     chan struct{} // closed when the supervisor has returned
	stopOnce sync.Once

	mu     sync.Mutex
	proc   *os.Process
	starts int
}

// Supervision constants.
const (
	readyTimeout   = 30 * time.Second
	stopTimeout    = 15 * time.Second
	restartBackoff = time.Second
	maxBackoff     = 30 * time.Second
	stableRun      = time.Minute // a daemon that ran this long restarts at once
)

// StartContainerd starts containerd with its state under dir and returns once
// the daemon answers on its socket. The binary is "containerd" from PATH; the
// daemon's PATH starts with the directory of the CRIU binary found on PATH,
// so runc, which the shim starts, runs that CRIU. log receives the
// supervisor's events (nil: slog.Default()).
func StartContainerd(ctx context.Context, dir string, log *slog.Logger) (*Containerd, error) {
	if log == nil {
		log = slog.Default()
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return nil, fmt.Errorf("executor: start containerd: %w: %w", ErrMissing, err)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("executor: start containerd: %w", err)
	}
	for _, sub := range []string{"root", "state", "executor"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o711); err != nil {
			return nil, fmt.Errorf("executor: start containerd: %w", err)
		}
	}
	if err := Searchable(dir); err != nil {
		return nil, fmt.Errorf("executor: start containerd: %w", err)
	}
	d := &Containerd{
		dir:     dir,
		address: filepath.Join(dir, "containerd.sock"),
		log:     log.With("component", "containerd", "dir", dir),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if len(d.address) > 100 {
		return nil, fmt.Errorf("executor: start containerd: socket path %s is too long for a unix socket", d.address)
	}
	if serving(ctx, d.address) {
		return nil, fmt.Errorf("executor: start containerd: %w: a daemon already answers at %s", ErrExists, d.address)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(daemonConfig(dir, d.address)), 0o600); err != nil {
		return nil, fmt.Errorf("executor: start containerd: %w", err)
	}

	ready := make(chan error, 1)
	go d.supervise(bin, ready)
	go d.capLog()
	select {
	case err := <-ready:
		if err != nil {
			d.Stop(context.Background())
			return nil, fmt.Errorf("executor: start containerd in %s: %w", dir, err)
		}
	case <-ctx.Done():
		d.Stop(context.Background())
		return nil, fmt.Errorf("executor: start containerd in %s: %w", dir, ctx.Err())
	}
	return d, nil
}

// Address is the daemon's gRPC socket.
func (d *Containerd) Address() string { return d.address }

// Dir is the directory holding the daemon's state.
func (d *Containerd) Dir() string { return d.dir }

// Config is the [Config] a [Client] of this daemon uses: its socket, the
// executor state directory beside the daemon's, and a cgroup parent unique
// to the directory, so that two embedded daemons on one host (tests, several
// simulated hosts) never share a runc root or a cgroup.
func (d *Containerd) Config() Config {
	sum := sha256.Sum256([]byte(d.dir))
	return Config{
		Address:      d.address,
		StateDir:     filepath.Join(d.dir, "executor"),
		CgroupParent: "/" + DefaultNamespace + "-" + hex.EncodeToString(sum[:4]),
	}
}

// RemoveCgroups removes the cgroup parent of this daemon's sandboxes
// ([Containerd.Config]) in every hierarchy, once the daemon is stopped:
// runc removes a sandbox's own cgroup, never the parent it was made
// under. A parent that still holds a sandbox (a unit left running in
// its shim) stays: rmdir refuses a cgroup that is not empty.
func (d *Containerd) RemoveCgroups() error {
	parent := strings.TrimPrefix(d.Config().CgroupParent, "/")
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", parent))
	var errs []error
	for _, dir := range dirs {
		err := syscall.Rmdir(dir)
		if err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOTEMPTY) {
			errs = append(errs, fmt.Errorf("executor: remove cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// Pid is the daemon's current process id, 0 while it is down.
func (d *Containerd) Pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return 0
	}
	return d.proc.Pid
}

// Restarts is how many times the supervisor restarted the daemon after it
// died.
func (d *Containerd) Restarts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(d.starts-1, 0)
}

// Stop stops the daemon: SIGTERM, then SIGKILL once ctx is done or 15 s have
// passed. Tasks keep running under their shims, as they do when a system
// containerd restarts; a later StartContainerd on the same directory finds
// them again. Stop is idempotent.
func (d *Containerd) Stop(ctx context.Context) error {
	d.stopOnce.Do(func() { close(d.stop) })
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	if p != nil {
		_ = p.Signal(syscall.SIGTERM)
	}
	ctx, cancel := context.WithTimeout(ctx, stopTimeout)
	defer cancel()
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
	}
	d.mu.Lock()
	p = d.proc
	d.mu.Unlock()
	if p != nil {
		_ = p.Kill()
	}
	<-d.done
	return fmt.Errorf("executor: stop containerd in %s: killed after %w", d.dir, ctx.Err())
}

// supervise runs the daemon until Stop, restarting it with backoff. It keeps
// its goroutine on one OS thread for its whole life: the child is started
// with a parent-death signal, which Linux sends when the *thread* that
// forked it exits, and a Go thread can exit under a goroutine that locked it.
func (d *Containerd) supervise(bin string, ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(d.done)
	backoff := restartBackoff
	first := true
	for {
		started := time.Now()
		run, err := d.spawn(bin)
		if err == nil && first {
			first = false
			err = d.waitReady(run)
			ready <- err
			if err != nil {
				_ = run.cmd.Process.Kill()
				<-run.exited
				return
			}
		}
		if err != nil {
			d.log.Error("containerd did not start", "err", err)
		} else {
			<-run.exited
			err = run.err
			d.mu.Lock()
			d.proc = nil
			d.mu.Unlock()
		}
		select {
		case <-d.stop:
			return
		default:
		}
		if time.Since(started) > stableRun {
			backoff = restartBackoff
		}
		d.log.Warn("containerd exited; restarting", "err", err, "after", backoff)
		select {
		case <-d.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// sweepDeletedBundles removes, while containerd is not running, the task
// bundles under its state directory state that a deletion renamed
// (.ID, beside where ID was) and did not remove: containerd killed between
// the two (with this daemon, kill -9). Left, the next deletion of a bundle
// of that id fails on the rename, the bundle stays, and every task of the
// id fails to be made ("mkdir …/ID: file exists"). Mounts under one are
// detached first. It returns those removed.
func sweepDeletedBundles(state string) []string {
	dirs, _ := filepath.Glob(filepath.Join(state, "io.containerd.runtime.v2.task", "*", ".*"))
	var out []string
	for _, dir := range dirs {
		if info, err := os.Lstat(dir); err != nil || !info.IsDir() {
			continue
		}
		if unmountUnder(dir) != nil || os.RemoveAll(dir) != nil {
			continue
		}
		out = append(out, dir)
	}
	return out
}

// daemonRun is one run of the daemon process.
type daemonRun struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been reaped
	err    error         // its Wait error, set before exited closes
}

// capLog rotates the daemon's log every containerdLogCheck until Stop.
func (d *Containerd) capLog() {
	l := d.logFile()
	t := time.NewTicker(containerdLogCheck)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		if _, err := l.rotate(); err != nil {
			d.log.Warn("containerd's log: could not rotate", "err", err)
		}
	}
}

// logFile is the daemon's log, capped.
func (d *Containerd) logFile() cappedLog {
	return cappedLog{path: filepath.Join(d.dir, "containerd.log"), max: containerdLogMax, keep: containerdLogKeep}
}

func (d *Containerd) spawn(bin string) (*daemonRun, error) {
	if _, err := d.logFile().rotate(); err != nil {
		d.log.Warn("containerd's log: could not rotate", "err", err)
	}
	for _, b := range sweepDeletedBundles(filepath.Join(d.dir, "state")) {
		d.log.Info("containerd: removed a task bundle whose deletion a kill cut short", "bundle", b)
	}
	logf, err := os.OpenFile(filepath.Join(d.dir, "containerd.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, "--config", filepath.Join(d.dir, "config.toml"))
	cmd.Stdout = logf
	cmd.Stderr = logf
	// runc, which the shim starts, runs the criu this process sees.
	cmd.Env = criu.LeadPath(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true, // a ^C at our terminal is ours to handle, not the daemon's
		Pdeathsig: syscall.SIGTERM,
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	run := &daemonRun{cmd: cmd, exited: make(chan struct{})}
	go func() {
		run.err = cmd.Wait()
		close(run.exited)
	}()
	d.mu.Lock()
	d.proc = cmd.Process
	d.starts++
	d.mu.Unlock()
	d.log.Info("containerd started", "pid", cmd.Process.Pid, "address", d.address)
	return run, nil
}

// waitReady polls the socket until the daemon answers, it exits, or
// readyTimeout passes.
func (d *Containerd) waitReady(run *daemonRun) error {
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok := serving(ctx, d.address)
		cancel()
		if ok {
			return nil
		}
		select {
		case <-run.exited:
			return fmt.Errorf("containerd exited before serving (%v); see %s", run.err, filepath.Join(d.dir, "containerd.log"))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("containerd did not answer at %s within %v; see %s", d.address, readyTimeout, filepath.Join(d.dir, "containerd.log"))
}

// serving reports whether a containerd answers at address.
func serving(ctx context.Context, address string) bool {
	if _, err := os.Stat(address); err != nil {
		return false
	}
	c, err := containerd.New(address, containerd.WithTimeout(time.Second))
	if err != nil {
		return false
	}
	defer c.Close()
	ok, err := c.IsServing(ctx)
	return err == nil && ok
}

// daemonConfig is the configuration of an embedded daemon, in the format
// of the containerd deploy/setup.sh installs (2.3: version 4, where the
// listeners are server plugins; 2.3 would migrate an older format at every
// start, with a warning, and 2.0-2.2 refuse this one). It turns off what a
// runrecordd host does not use: the CRI server, snapshotters other than
// overlayfs and native, erofs, tracing, NRI; the debug and metrics
// listeners stay off (they have no address). The GC collects after every
// deletion, so the blobs a checkpoint stages in the content store go
// promptly.
func daemonConfig(dir, address string) string {
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	disabled := []string{
		"io.containerd.grpc.v1.cri",
		"io.containerd.cri.v1.images",
		"io.containerd.cri.v1.runtime",
		"io.containerd.podsandbox.controller.v1.podsandbox",
		"io.containerd.snapshotter.v1.aufs",
		"io.containerd.snapshotter.v1.btrfs",
		"io.containerd.snapshotter.v1.devmapper",
		"io.containerd.snapshotter.v1.zfs",
		"io.containerd.snapshotter.v1.blockfile",
		"io.containerd.snapshotter.v1.erofs",
		"io.containerd.differ.v1.erofs",
		"io.containerd.mount-handler.v1.erofs",
		"io.containerd.tracing.processor.v1.otlp",
		"io.containerd.internal.v1.tracing",
		"io.containerd.nri.v1.nri",
	}
	quoted := make([]string, len(disabled))
	for i, p := range disabled {
		quoted[i] = q(p)
	}
	return fmt.Sprintf(`# Written by runrecordd's executor; rewritten at every start.
version = 4
root = %s
state = %s
disabled_plugins = [%s]

[debug]
  level = "info"

[plugins."io.containerd.server.v1.grpc"]
  address = %s
  uid = 0
  gid = 0

[plugins."io.containerd.server.v1.ttrpc"]
  address = %s
  uid = 0
  gid = 0

[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 1
  schedule_delay = "0ms"
`, q(filepath.Join(dir, "root")), q(filepath.Join(dir, "state")), strings.Join(quoted, ", "),
		q(address), q(address+".ttrpc"))
}
