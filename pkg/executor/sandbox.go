//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Spec is what a sandbox runs and what it may use.
type Spec struct {
	// Image is the image's name, as imported.
	Image string
	// ImageDigest, when set, is the manifest digest the image must have
	// ("sha256:…"); a different one is [ErrImageMismatch].
	ImageDigest string
	// Args is the argv; empty runs the image's entrypoint and cmd.
	Args []string
	// Env entries (KEY=VALUE) override or extend the image's.
	Env []string
	// MilliCPU is the CPU limit in thousandths of a core, enforced as a CFS
	// quota over a 100 ms period; 0 is unlimited, otherwise at least 10.
	MilliCPU uint32
	// MemoryBytes is the memory limit; 0 is [DefaultMemoryBytes].
	MemoryBytes uint64
	// Pids caps the processes and threads of the sandbox (its cgroup's
	// pids controller); 0 is unit.DefaultLimits.Pids.
	Pids uint32
	// LogBytes caps each of stdout and stderr: what the unit writes past
	// it is discarded, after one line saying so (see [Output]); 0 is
	// unit.DefaultLimits.LogBytes.
	LogBytes uint64
	// RootfsBytes caps the rw layer a checkpoint writes (see
	// [Checkpoint.MaxRootfsBytes]); 0 is unit.DefaultLimits.SnapshotBytes.
	RootfsBytes uint64
	// Network is the sandbox's network: its own namespace either way, with
	// loopback down ([unit.NoNetwork], also the zero value) or up
	// ([unit.Loopback]), and MPTCP off (netns_linux.go).
	Network unit.Network
	// Mounts are bind mounts, mounted in order. Their sources must pass
	// the host-path policy (see [Mount]).
	Mounts []Mount
}

// DefaultMemoryBytes is a sandbox's memory limit when its spec (its grant
// set) names none.
const DefaultMemoryBytes = 1 << 30

// Mount is a bind mount of a host path into the sandbox: recursive (the
// mounts below the source come along), nosuid and nodev on every one of
// them, and, unless Writable, read-only on every one of them too.
//
// The source must be a directory or a regular file once its symlinks are
// resolved, and neither the host's root nor in /proc, /sys, /dev or /run
// ([unit.CheckSource]); nor, unless Own, the executor's state directory
// or a [Config.Protected] directory, something inside one, or a
// directory holding one. Otherwise the sandbox is not made:
// [ErrInvalid].
type Mount struct {
	Source string // absolute host path
	Target string // absolute path in the sandbox
	// Writable mounts read-write (a transcript directory); otherwise
	// read-only.
	Writable bool
	// Own marks a mount the daemon makes for itself (the transcript
	// channel, under its state directory), which may lie inside a
	// protected directory; it is also noexec. Every other rule holds.
	Own bool
}

// SpecOf is the sandbox spec of a unit run under grants.
func SpecOf(s unit.Spec, g unit.Grants) Spec {
	out := Spec{
		Image:       s.Image,
		ImageDigest: s.ImageDigest,
		Args:        s.Args,
		Env:         s.Env,
		MilliCPU:    g.MilliCPU,
		MemoryBytes: g.MemoryBytes,
		Network:     g.Network,
	}
	l := g.Limits.Or(unit.DefaultLimits)
	out.Pids, out.LogBytes, out.RootfsBytes = l.Pids, l.LogBytes, l.SnapshotBytes
	for _, m := range g.ReadOnly {
		out.Mounts = append(out.Mounts, Mount{Source: m.Source, Target: m.Target})
	}
	return out
}

func (s *Spec) validate() error {
	if s.Image == "" {
		return fmt.Errorf("%w: spec has no image", ErrInvalid)
	}
	if s.MilliCPU != 0 && s.MilliCPU < 10 {
		return fmt.Errorf("%w: CPU limit %d millicores is below 10", ErrInvalid, s.MilliCPU)
	}
	switch s.Network {
	case 0, unit.NoNetwork, unit.Loopback:
	default:
		return fmt.Errorf("%w: network %s", ErrInvalid, s.Network)
	}
	for _, m := range s.Mounts {
		if !path.IsAbs(m.Source) || !path.IsAbs(m.Target) || path.Clean(m.Target) == "/" {
			return fmt.Errorf("%w: mount %s:%s: paths must be absolute, target not /", ErrInvalid, m.Source, m.Target)
		}
	}
	return nil
}

// withDefaults is s with its zero limits at their defaults.
func (s Spec) withDefaults() Spec {
	if s.MemoryBytes == 0 {
		s.MemoryBytes = DefaultMemoryBytes
	}
	if s.Pids == 0 {
		s.Pids = unit.DefaultLimits.Pids
	}
	if s.LogBytes == 0 {
		s.LogBytes = unit.DefaultLimits.LogBytes
	}
	if s.RootfsBytes == 0 {
		s.RootfsBytes = unit.DefaultLimits.SnapshotBytes
	}
	return s
}

// checkSource applies the host-path policy (see [Mount]) to m's source.
func (c *Client) checkSource(m Mount) error {
	refuse := func(why string, args ...any) error {
		return fmt.Errorf("%w: mount source %s: %s", ErrInvalid, m.Source, fmt.Sprintf(why, args...))
	}
	if err := unit.CheckSource(path.Clean(m.Source)); err != nil {
		return refuse("%v", err)
	}
	real, err := filepath.EvalSymlinks(m.Source)
	if err != nil {
		return refuse("%v", err)
	}
	if err := unit.CheckSource(real); err != nil {
		return refuse("resolves to %s: %v", real, err)
	}
	fi, err := os.Lstat(real)
	if err != nil {
		return refuse("%v", err)
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return refuse("resolves to %s, a %s: only directories and regular files are mounted", real, fileType(fi.Mode()))
	}
	if m.Own {
		return nil
	}
	for _, p := range append([]string{c.cfg.StateDir}, c.cfg.Protected...) {
		if rp, err := filepath.EvalSymlinks(p); err == nil {
			p = rp
		}
		if within(real, p) || within(p, real) {
			return refuse("resolves to %s, which is, holds or lies in the protected %s", real, p)
		}
	}
	return nil
}

// within says whether path p is dir or lies under it (both clean and
// absolute).
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

func fileType(m os.FileMode) string {
	switch {
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// Output names the files a sandbox's stdout and stderr are appended to;
// an empty name discards that stream. The executor copies each stream from
// containerd's FIFO into its file, so a reader sees output as it is written.
type Output struct {
	Stdout string
	Stderr string
}

// Container labels under which a sandbox remembers its output files, so
// that [Client.Load] can reattach after this process restarts.
const (
	labelStdout = "runrecordd.stdout"
	labelStderr = "runrecordd.stderr"
	// labelLogBytes and labelRootfsBytes keep the spec's LogBytes and
	// RootfsBytes (decimal).
	labelLogBytes    = "runrecordd.log-bytes"
	labelRootfsBytes = "runrecordd.rootfs-bytes"
)

// Sandbox is one container with its task.
type Sandbox struct {
	c    *Client
	id   string
	cont containerd.Container

	mu    sync.Mutex // serialises Destroy and guards files
	task  containerd.Task
	files []*os.File
	out   [2]*capped // stdout, stderr; nil for a discarded stream

	// logBytes and rootfsBytes are the spec's limits (from the labels
	// after a Load).
	logBytes, rootfsBytes uint64

	exited chan struct{}         // closed once the task's process has exited
	status containerd.ExitStatus // the exit, readable after exited closes
}

// watch records the task's exit from ch.
func (s *Sandbox) watch(ch <-chan containerd.ExitStatus) {
	s.exited = make(chan struct{})
	go func() {
		s.status = <-ch
		close(s.exited)
	}()
}

// ID is the sandbox's id (its container's, task's and snapshot's).
func (s *Sandbox) ID() string { return s.id }

// Pid is the host pid of the sandbox's init process.
func (s *Sandbox) Pid() uint32 { return s.task.Pid() }

// Start creates sandbox id from spec and starts its process.
func (c *Client) Start(ctx context.Context, id string, spec Spec, out Output) (*Sandbox, error) {
	s, err := c.create(ctx, id, spec, out, nil)
	if err != nil {
		return nil, fmt.Errorf("executor: start %s: %w", id, err)
	}
	return s, nil
}

// restoreFrom is what create needs to restore instead of start.
type restoreFrom struct {
	images string // CRIU image directory (staged)
	rootfs string // rw layer tar, or ""
	work   string // CRIU work directory
	// deadline bounds the task's creation, CRIU's restore (0: none).
	deadline time.Duration

	rootfsTime, taskTime time.Duration // set by create
	timedOut             bool          // set by create: the deadline passed
}

func (c *Client) create(ctx context.Context, id string, spec Spec, out Output, rs *restoreFrom) (_ *Sandbox, retErr error) {
	ctx = c.ctx(ctx)
	if err := identifiers.Validate(id); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	spec = spec.withDefaults()
	for _, m := range spec.Mounts {
		if err := c.checkSource(m); err != nil {
			return nil, err
		}
	}
	img, err := c.client.GetImage(ctx, spec.Image)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("image %s: %w", spec.Image, ErrNotFound)
		}
		return nil, fmt.Errorf("image %s: %w", spec.Image, err)
	}
	if spec.ImageDigest != "" {
		desc, err := c.describe(ctx, img)
		if err != nil {
			return nil, err
		}
		if desc.Digest != spec.ImageDigest {
			return nil, fmt.Errorf("image %s: %w: has %s, spec names %s", spec.Image, ErrImageMismatch, desc.Digest, spec.ImageDigest)
		}
	}
	if ok, err := img.IsUnpacked(ctx, Snapshotter); err != nil {
		return nil, fmt.Errorf("image %s: %w", spec.Image, err)
	} else if !ok {
		if err := img.Unpack(ctx, Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack %s: %w", spec.Image, err)
		}
	}
	if _, err := c.client.LoadContainer(ctx, id); err == nil {
		return nil, fmt.Errorf("%w: a container named %s", ErrExists, id)
	}

	snapshot := containerd.WithNewSnapshot(id, img)
	if rs != nil {
		// The snapshot is made before its container; a lease until the
		// container exists keeps the GC (which runs on every deletion)
		// from taking it in between.
		lctx, done, err := c.client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
		if err != nil {
			return nil, fmt.Errorf("lease: %w", err)
		}
		defer done(context.WithoutCancel(ctx))
		ctx = lctx
		t0 := time.Now()
		if err := c.prepareRootfs(ctx, id, img, rs.rootfs); err != nil {
			return nil, err
		}
		rs.rootfsTime = time.Since(t0)
		defer func() {
			if retErr != nil {
				_ = c.client.SnapshotService(Snapshotter).Remove(ctx, id)
			}
		}()
		snapshot = containerd.WithSnapshot(id)
	}

	// A pin left by a process that died between making it and creating
	// the container (no container has this id: checked above).
	netns := c.netnsPath(id)
	if err := removeNetns(netns); err != nil {
		return nil, err
	}
	if err := makeNetns(netns, spec.Network == unit.Loopback); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	defer func() {
		if retErr != nil {
			if err := removeNetns(netns); err != nil {
				c.log.Warn("cleanup after failed create", "id", id, "err", err)
			}
		}
	}()
	// Read-only grants of directories go through overlays (grants.go).
	if err := c.removeGrants(id); err != nil {
		return nil, err
	}
	if spec.Mounts, err = c.overlayGrants(id, spec.Mounts); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			if err := c.removeGrants(id); err != nil {
				c.log.Warn("cleanup after failed create", "id", id, "err", err)
			}
		}
	}()

	cont, err := c.client.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithSnapshotter(Snapshotter),
		snapshot,
		containerd.WithRuntime(Runtime, &options.Options{Root: c.cfg.RuncRoot}),
		containerd.WithNewSpec(c.specOpts(img, id, spec)...),
		containerd.WithContainerLabels(map[string]string{
			labelStdout: out.Stdout, labelStderr: out.Stderr,
			labelLogBytes:    strconv.FormatUint(spec.LogBytes, 10),
			labelRootfsBytes: strconv.FormatUint(spec.RootfsBytes, 10),
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	s := &Sandbox{c: c, id: id, cont: cont, logBytes: spec.LogBytes, rootfsBytes: spec.RootfsBytes}
	defer func() {
		if retErr != nil {
			if err := s.destroy(context.WithoutCancel(ctx)); err != nil {
				c.log.Warn("cleanup after failed create", "id", id, "err", err)
			}
			if rs != nil {
				// A CRIU killed mid-restore leaves its cgroup yard
				// mounted under its work directory.
				for _, dir := range []string{rs.work, filepath.Join(c.cfg.RuncRoot, c.cfg.Namespace, id)} {
					if err := unmountUnder(dir); err != nil {
						c.log.Warn("unmounting what CRIU left", "id", id, "dir", dir, "err", err)
					}
				}
			}
		}
	}()

	stdout, stderr, err := s.openOutput(out)
	if err != nil {
		return nil, err
	}
	creator := cio.NewCreator(cio.WithStreams(nil, stdout, stderr), cio.WithFIFODir(filepath.Join(c.cfg.StateDir, "fifo")))
	taskStart := time.Now()
	var taskOpts []containerd.NewTaskOpts
	if rs != nil {
		taskOpts = append(taskOpts, containerd.WithRestoreImagePath(rs.images), containerd.WithRestoreWorkPath(rs.work))
	}
	// A restore is CRIU's, under the deadline: containerd's shim runs
	// runc restore when the task is started (and a shim that did it at
	// creation would be covered too).
	bounded := func(call func(context.Context) error) error {
		if rs == nil {
			return call(ctx)
		}
		timedOut, err := c.underDeadline(ctx, id, rs.deadline, func() int { return 0 }, call)
		if timedOut {
			rs.timedOut = true
			if err == nil {
				// Done as the deadline passed: what it restored
				// may have been killed.
				err = errors.New("the restore returned as its deadline passed")
			}
		}
		return err
	}
	var task containerd.Task
	if err := bounded(func(ctx context.Context) (err error) {
		task, err = cont.NewTask(ctx, creator, taskOpts...)
		return err
	}); err != nil {
		return nil, fmt.Errorf("task: %w", err)
	}
	s.task = task
	// The exit channel must outlive the caller's ctx: it is how Destroy
	// and Checkpoint learn that the process has gone.
	exit, err := task.Wait(c.ctx(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, fmt.Errorf("task wait: %w", err)
	}
	s.watch(exit)
	if err := bounded(task.Start); err != nil {
		return nil, fmt.Errorf("task start: %w", err)
	}
	if rs != nil {
		rs.taskTime = time.Since(taskStart)
	}
	return s, nil
}

func (c *Client) specOpts(img containerd.Image, id string, spec Spec) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithHostname("unit"),
		oci.WithCgroup(path.Join(c.cfg.CgroupParent, id)),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: c.netnsPath(id)}),
		// runc hands this file to CRIU at every dump and restore of the
		// sandbox (see criuConfig).
		oci.WithAnnotations(map[string]string{"org.criu.config": c.criuConfigPath()}),
	}
	if len(spec.Args) > 0 {
		opts = append(opts, oci.WithProcessArgs(spec.Args...))
	}
	if len(spec.Env) > 0 {
		opts = append(opts, oci.WithEnv(spec.Env))
	}
	if spec.MilliCPU > 0 {
		const period = 100_000 // µs
		opts = append(opts, oci.WithCPUCFS(int64(spec.MilliCPU)*period/1000, period))
	}
	// spec has its defaults (withDefaults): never unlimited.
	opts = append(opts, oci.WithMemoryLimit(spec.MemoryBytes), oci.WithPidsLimit(int64(spec.Pids)))
	if len(spec.Mounts) > 0 {
		var ms []specs.Mount
		for _, m := range spec.Mounts {
			ms = append(ms, specs.Mount{
				Destination: m.Target,
				Type:        "bind",
				Source:      m.Source,
				Options:     mountOptions(m),
			})
		}
		opts = append(opts, oci.WithMounts(ms))
	}
	// After the capabilities (containerd's default set, from
	// WithNewSpec), which the profile follows: it allows what they
	// allow. no_new_privs is containerd's default too; said here so
	// that it stays.
	return append(opts, oci.WithNoNewPrivileges, seccomp.WithDefaultProfile())
}

// mountOptions are the OCI options of a bind mount. "ro" alone makes only
// the top mount read-only: a mount below the source (rbind brings them
// along) would stay writable. runc (1.1 and later) applies the r* options
// with mount_setattr(AT_RECURSIVE) to the whole tree.
func mountOptions(m Mount) []string {
	opts := []string{"rbind", "nosuid", "nodev", "rnosuid", "rnodev"}
	if m.Writable {
		opts = append(opts, "rw")
	} else {
		opts = append(opts, "ro", "rro")
	}
	if m.Own {
		opts = append(opts, "noexec", "rnoexec")
	}
	return opts
}

// openOutput opens the output files for appending, each capped at
// s.logBytes (see capped).
func (s *Sandbox) openOutput(out Output) (io.Writer, io.Writer, error) {
	open := func(i int, stream, name string) (io.Writer, error) {
		if name == "" {
			return io.Discard, nil
		}
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("output: %w", err)
		}
		s.files = append(s.files, f)
		w, err := newCapped(f, stream, int64(min(s.logBytes, 1<<62)), s.c.log.With("sandbox", s.id))
		if err != nil {
			return nil, fmt.Errorf("output: %w", err)
		}
		s.out[i] = w
		return w, nil
	}
	stdout, err := open(0, "stdout", out.Stdout)
	if err != nil {
		return nil, nil, err
	}
	stderr, err := open(1, "stderr", out.Stderr)
	if err != nil {
		return nil, nil, err
	}
	return stdout, stderr, nil
}

// Omitted is how many bytes of the unit's stdout and stderr this process
// has discarded since it attached, past the spec's LogBytes.
func (s *Sandbox) Omitted() (stdout, stderr uint64) {
	if w := s.out[0]; w != nil {
		stdout = w.omitted.Load()
	}
	if w := s.out[1]; w != nil {
		stderr = w.omitted.Load()
	}
	return stdout, stderr
}

// Load finds sandbox id, left running by an earlier process, and reattaches
// its output to the files it was started with.
func (c *Client) Load(ctx context.Context, id string) (*Sandbox, error) {
	ctx = c.ctx(ctx)
	cont, err := c.client.LoadContainer(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("executor: load %s: %w", id, ErrNotFound)
		}
		return nil, fmt.Errorf("executor: load %s: %w", id, err)
	}
	labels, err := cont.Labels(ctx)
	if err != nil {
		return nil, fmt.Errorf("executor: load %s: %w", id, err)
	}
	s := &Sandbox{c: c, id: id, cont: cont,
		logBytes:    labelUint(labels, labelLogBytes, unit.DefaultLimits.LogBytes),
		rootfsBytes: labelUint(labels, labelRootfsBytes, unit.DefaultLimits.SnapshotBytes)}
	stdout, stderr, err := s.openOutput(Output{Stdout: labels[labelStdout], Stderr: labels[labelStderr]})
	if err != nil {
		s.closeFiles()
		return nil, fmt.Errorf("executor: load %s: %w", id, err)
	}
	task, err := cont.Task(ctx, cio.NewAttach(cio.WithStreams(nil, stdout, stderr)))
	if err != nil {
		s.closeFiles()
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("executor: load %s: task: %w", id, ErrNotFound)
		}
		return nil, fmt.Errorf("executor: load %s: %w", id, err)
	}
	exit, err := task.Wait(c.ctx(context.WithoutCancel(ctx)))
	if err != nil {
		s.closeFiles()
		return nil, fmt.Errorf("executor: load %s: %w", id, err)
	}
	s.task = task
	s.watch(exit)
	return s, nil
}

// labelUint is the decimal label key, or def when it is absent or not a
// positive number (a sandbox made before the label existed).
func labelUint(labels map[string]string, key string, def uint64) uint64 {
	v, err := strconv.ParseUint(labels[key], 10, 64)
	if err != nil || v == 0 {
		return def
	}
	return v
}

// List returns the ids of the sandboxes in the namespace.
func (c *Client) List(ctx context.Context) ([]string, error) {
	cs, err := c.client.Containers(c.ctx(ctx))
	if err != nil {
		return nil, fmt.Errorf("executor: list: %w", err)
	}
	ids := make([]string, len(cs))
	for i, ct := range cs {
		ids[i] = ct.ID()
	}
	return ids, nil
}

// Status is the task's state: "running", "paused", "stopped", …
func (s *Sandbox) Status(ctx context.Context) (string, error) {
	st, err := s.task.Status(s.c.ctx(ctx))
	if err != nil {
		return "", fmt.Errorf("executor: status of %s: %w", s.id, err)
	}
	return string(st.Status), nil
}

// Wait waits for the sandbox's process to exit and returns its exit code.
func (s *Sandbox) Wait(ctx context.Context) (uint32, error) {
	select {
	case <-s.exited:
		code, _, err := s.status.Result()
		if err != nil {
			return 0, fmt.Errorf("executor: wait for %s: %w", s.id, err)
		}
		return code, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("executor: wait for %s: %w", s.id, ctx.Err())
	}
}

// Pause freezes the sandbox's processes (cgroup freezer).
func (s *Sandbox) Pause(ctx context.Context) error {
	if err := s.task.Pause(s.c.ctx(ctx)); err != nil {
		return fmt.Errorf("executor: pause %s: %w", s.id, err)
	}
	return nil
}

// Resume thaws a paused sandbox, such as one a [Checkpoint] with Keep left
// frozen whose park did not go through.
func (s *Sandbox) Resume(ctx context.Context) error {
	if err := s.task.Resume(s.c.ctx(ctx)); err != nil {
		return fmt.Errorf("executor: resume %s: %w", s.id, err)
	}
	return nil
}

// Settle puts a sandbox whose checkpoint did not go through back to
// running, going by the task's real state rather than by what the failed
// checkpoint should have left:
//
//   - a CRIU (and the runc that started it) still running beside the unit
//     — a daemon that died in the middle of a park leaves them, holding the
//     unit seized — is killed, and what it may have left in the unit is
//     cleared (see releaseCRIU);
//   - a frozen task (paused, or left pausing) is thawed, and the shim's
//     idea of it made to agree with the freezer;
//   - a running one is left alone, and one that has exited is [ErrExited].
func (s *Sandbox) Settle(ctx context.Context) error {
	if err := s.settle(ctx, false); err != nil {
		return fmt.Errorf("executor: settle %s: %w", s.id, err)
	}
	return nil
}

// settle is Settle; killed says that CRIU was killed already (a deadline).
func (s *Sandbox) settle(ctx context.Context, killed bool) error {
	// The caller's context may be what failed; the thaw must still happen.
	ctx, cancel := context.WithTimeout(s.c.ctx(context.WithoutCancel(ctx)), 30*time.Second)
	defer cancel()
	unit := int(s.task.Pid())
	if pids, err := s.c.freezeThenKill(s.id, unit); err != nil {
		return fmt.Errorf("killing CRIU: %w", err)
	} else if len(pids) > 0 {
		s.c.log.Warn("killed a CRIU left holding the unit", "sandbox", s.id, "pids", pids)
		killed = true
	}
	var errs []error
	if killed {
		errs = append(errs, s.c.releaseCRIU(s.id, unit))
	}
	st, err := s.task.Status(ctx)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return ErrExited
		}
		return errors.Join(append(errs, fmt.Errorf("task status: %w", err))...)
	}
	switch st.Status {
	case containerd.Running:
	case containerd.Stopped:
		return ErrExited
	case containerd.Paused, containerd.Pausing:
		errs = append(errs, s.thaw(ctx))
	default:
		errs = append(errs, fmt.Errorf("task in state %q", st.Status))
	}
	return errors.Join(errs...)
}

// thaw thaws a task the shim holds paused. After a killed CRIU the
// freezer may be thawed already (CRIU thaws the cgroup once it has seized
// the tasks) while the shim still says paused, and runc then refuses the
// resume: the cgroup is frozen again so that runc's resume goes through
// and the shim agrees with the freezer; where that fails too the cgroup is
// thawed directly, so that the unit at least runs.
func (s *Sandbox) thaw(ctx context.Context) error {
	err := s.task.Resume(ctx)
	if err == nil {
		return nil
	}
	if ferr := s.c.setFreezer(s.id, true); ferr == nil {
		if err = s.task.Resume(ctx); err == nil {
			return nil
		}
	}
	if terr := s.c.setFreezer(s.id, false); terr != nil {
		return errors.Join(fmt.Errorf("thaw: %w", err), terr)
	}
	return fmt.Errorf("thawed through the cgroup, but the shim still holds the task paused: %w", err)
}

// setFreezer freezes or thaws sandbox id's cgroup directly: cgroup v1's
// freezer or v2's cgroup.freeze, whichever the host has.
func (c *Client) setFreezer(id string, frozen bool) error {
	rel := path.Join(c.cfg.CgroupParent, id)
	v1 := filepath.Join("/sys/fs/cgroup/freezer", rel, "freezer.state")
	if _, err := os.Stat(v1); err == nil {
		state := "THAWED"
		if frozen {
			state = "FROZEN"
		}
		if err := os.WriteFile(v1, []byte(state), 0); err != nil {
			return err
		}
		if frozen {
			// FREEZING until every task has stopped.
			for range 100 {
				b, err := os.ReadFile(v1)
				if err != nil || strings.TrimSpace(string(b)) == "FROZEN" {
					return err
				}
				time.Sleep(10 * time.Millisecond)
			}
			return fmt.Errorf("cgroup %s did not freeze", rel)
		}
		return nil
	}
	v2 := filepath.Join("/sys/fs/cgroup", rel, "cgroup.freeze")
	if _, err := os.Stat(v2); err == nil {
		state := "0"
		if frozen {
			state = "1"
		}
		return os.WriteFile(v2, []byte(state), 0)
	}
	return fmt.Errorf("no freezer for cgroup %s", rel)
}

// Usage is a sandbox's resource use from its cgroup.
type Usage struct {
	// CPUNanos is the CPU time used by all its processes, user and system.
	CPUNanos uint64
	// MemoryBytes is current memory use (page cache included, as the
	// cgroup counts it); MemoryMaxBytes the high-water mark (cgroup v1
	// only; 0 on v2).
	MemoryBytes    uint64
	MemoryMaxBytes uint64
	// Pids is the number of tasks in the cgroup.
	Pids uint64
}

// Stats reads the sandbox's cgroup through the task metrics (cgroup v1 or
// v2, whichever the host runs).
func (s *Sandbox) Stats(ctx context.Context) (Usage, error) {
	m, err := s.task.Metrics(s.c.ctx(ctx))
	if err != nil {
		return Usage{}, fmt.Errorf("executor: stats of %s: %w", s.id, err)
	}
	data, err := typeurl.UnmarshalAny(m.Data)
	if err != nil {
		return Usage{}, fmt.Errorf("executor: stats of %s: %w", s.id, err)
	}
	var u Usage
	switch m := data.(type) {
	case *v1.Metrics:
		u.CPUNanos = m.GetCPU().GetUsage().GetTotal()
		u.MemoryBytes = m.GetMemory().GetUsage().GetUsage()
		u.MemoryMaxBytes = m.GetMemory().GetUsage().GetMax()
		u.Pids = m.GetPids().GetCurrent()
	case *v2.Metrics:
		u.CPUNanos = m.GetCPU().GetUsageUsec() * 1000
		u.MemoryBytes = m.GetMemory().GetUsage()
		u.Pids = m.GetPids().GetCurrent()
	default:
		return Usage{}, fmt.Errorf("executor: stats of %s: unknown metrics type %T", s.id, data)
	}
	return u, nil
}

// Destroy kills the sandbox's processes and deletes its task, container,
// snapshot and CRIU work files. It is idempotent, and safe on a sandbox
// whose task has exited (after a checkpoint).
func (s *Sandbox) Destroy(ctx context.Context) error {
	err := s.destroy(s.c.ctx(ctx))
	if rerr := removeTree(filepath.Join(s.c.cfg.StateDir, "criu", s.id)); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("executor: destroy %s: %w", s.id, err)
	}
	return nil
}

func (s *Sandbox) destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.task != nil {
		if err := s.killTask(ctx); err != nil {
			errs = append(errs, err)
		}
		if _, err := s.task.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete task: %w", err))
		}
	}
	if err := s.cont.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete container: %w", err))
	} else if err := removeNetns(s.c.netnsPath(s.id)); err != nil {
		errs = append(errs, err)
	} else if err := s.c.removeGrants(s.id); err != nil {
		errs = append(errs, err)
	}
	s.closeFilesLocked()
	return errors.Join(errs...)
}

// killTask kills every process of the task, unless it has already stopped,
// and waits for the exit.
func (s *Sandbox) killTask(ctx context.Context) error {
	// A CRIU left holding the unit (a daemon that died in a park) would
	// keep it from dying.
	if _, err := s.c.killHelpers(s.c.cfg.Namespace, s.id, 0); err != nil {
		return fmt.Errorf("killing CRIU: %w", err)
	}
	st, err := s.task.Status(ctx)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("task status: %w", err)
	}
	switch st.Status {
	case containerd.Stopped:
		return nil
	case containerd.Created:
		// Never started (a restore that failed, or a start cut
		// short): no exit will come; the task's delete removes what
		// runc made of it.
		return nil
	}
	if err := s.task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("kill: %w", err)
	}
	if st.Status == containerd.Paused {
		// A frozen process acts on SIGKILL only once thawed.
		_ = s.task.Resume(ctx)
	}
	if s.exited == nil {
		return nil // create failed before it could watch; Delete reaps
	}
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-s.exited:
	case <-t.C:
		return fmt.Errorf("kill: the task did not exit within 30 s")
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (s *Sandbox) closeFiles() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeFilesLocked()
}

func (s *Sandbox) closeFilesLocked() {
	for _, f := range s.files {
		f.Close()
	}
	s.files = nil
}

// Remove removes sandbox id in whatever state it is — its task killed
// (thawed first if frozen) and deleted, its container, snapshot, network
// namespace and CRIU work files — without reattaching its output, as for
// a sandbox whose run is closed or unknown. A sandbox that is not there is
// not an error.
func (c *Client) Remove(ctx context.Context, id string) error {
	ctx = c.ctx(ctx)
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		err = errors.Join(removeNetns(c.netnsPath(id)), removeTree(filepath.Join(c.cfg.StateDir, "criu", id)), c.removeGrants(id))
		if err != nil {
			return fmt.Errorf("executor: remove %s: %w", id, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("executor: remove %s: %w", id, err)
	}
	s := &Sandbox{c: c, id: id, cont: cont}
	if task, err := cont.Task(ctx, nil); err == nil {
		s.task = task
		if exit, err := task.Wait(c.ctx(context.WithoutCancel(ctx))); err == nil {
			s.watch(exit)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("executor: remove %s: %w", id, err)
	}
	return s.Destroy(ctx)
}

// Prune removes what sandboxes that are gone left of the executor's own
// state: pinned network namespaces and CRIU work directories of ids
// containerd has no container for. It returns those ids.
func (c *Client) Prune(ctx context.Context) ([]string, error) {
	ids, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, id := range ids {
		have[id] = true
	}
	var pruned []string
	var errs []error
	for _, dir := range []string{"netns", "criu", "grants"} {
		ents, err := os.ReadDir(filepath.Join(c.cfg.StateDir, dir))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		for _, e := range ents {
			id := e.Name()
			if have[id] || id == ".empty" {
				continue
			}
			p := filepath.Join(c.cfg.StateDir, dir, id)
			if dir == "netns" {
				err = removeNetns(p)
				pruned = append(pruned, id)
			} else {
				err = removeTree(p)
			}
			errs = append(errs, err)
		}
	}
	return pruned, errors.Join(errs...)
}
