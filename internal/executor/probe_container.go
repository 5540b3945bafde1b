//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// probeNamespace is the containerd namespace the container probe uses, so
// that its sandboxes never mix with the runs'.
func (c *Client) probeNamespace() string { return c.cfg.Namespace + "-probe" }

// probeContainer runs a throwaway container (the host's sleep, over a root
// of the host's /usr), checkpoints it through containerd's task checkpoint
// with an image path, and restores it in a new container from the images,
// as a park and a resume do. It returns CRIU's logs.
//
// With r, the containers are in a user namespace mapped to r, as a
// sandbox with one is (usernsOpts), and the restore reads staged images
// (stageImages).
//
// Its steps follow a park and a resume: a root to run in, a start, the
// dump (which ends the first container), a restore from its images, and a
// look at the restored task. Everything it made is removed however it
// ends, its directory last, as a CRIU killed mid-restore leaves mounts
// there.
func (c *Client) probeContainer(ctx context.Context, deadline time.Duration, r *idmap.Range) (logs []byte, err error) {
	ns := c.probeNamespace()
	ctx = namespaces.WithNamespace(ctx, ns)
	c.sweepProbes(ctx)
	id, dir, err := c.probeDir()
	if err != nil {
		return nil, err
	}
	defer func() {
		// A CRIU killed mid-restore leaves mounts here (its cgroup
		// yard): detach them before anything is removed.
		if err := removeTree(dir); err != nil {
			c.log.Warn("probe: removing its directory", "dir", dir, "err", err)
		}
	}()
	p := &containerProbe{
		c: c, ns: ns, id: id, deadline: deadline,
		root: filepath.Join(dir, "rootfs"), images: filepath.Join(dir, "images"),
		dump: filepath.Join(dir, "dump"), restore: filepath.Join(dir, "restore"),
		netns: filepath.Join(c.cfg.StateDir, "netns-probe", id), userns: r,
	}
	if r != nil {
		// runc sets the root up as the range's root: it reaches it, and
		// owns it.
		for _, d := range []string{c.cfg.StateDir, filepath.Dir(dir), dir} {
			if err := Searchable(d); err != nil {
				return nil, err
			}
		}
	}
	if err := p.makeRoot(); err != nil {
		return nil, err
	}
	if r != nil {
		err := filepath.WalkDir(p.root, func(path string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, int(r.Base), int(r.Base))
		})
		if err != nil {
			return nil, err
		}
	}
	defer func() {
		logs = criu.ReadLogs(filepath.Join(p.dump, "dump.log"), filepath.Join(p.restore, "restore.log"))
	}()
	defer removeNetns(p.netns)

	cont, task, err := p.start(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("container probe: start: %w", err)
	}
	// runc start returns before its init has exec'd sleep: a dump
	// then would meet runc's own memfd mapping, which CRIU refuses.
	wctx, cancel := context.WithTimeout(ctx, deadline)
	err = waitExec(wctx, int(task.Pid()), "sleep")
	cancel()
	if err != nil {
		c.removeProbe(ctx, cont, task)
		return nil, fmt.Errorf("container probe: %w", err)
	}
	if err := p.checkpoint(ctx, cont, task); err != nil {
		return nil, err
	}
	images := p.images
	if r != nil {
		if err := os.Mkdir(p.restore, 0o700); err != nil {
			return nil, err
		}
		if images, err = stageImages(p.images, p.restore, *r); err != nil {
			return nil, fmt.Errorf("container probe: staging the images: %w", err)
		}
	}
	cont, task, err = p.start(ctx, images)
	if err != nil {
		return nil, fmt.Errorf("container probe: restore: %w", err)
	}
	defer c.removeProbe(ctx, cont, task)
	st, err := task.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("container probe: restored task: %w", err)
	}
	if st.Status != containerd.Running {
		return nil, fmt.Errorf("container probe: the restored task is %s, not running", st.Status)
	}
	return nil, nil
}

// containerProbe is one container probe: the id of its containers (the
// started one, then the restored one), their containerd namespace, its
// paths and the deadline of each CRIU step.
type containerProbe struct {
	c        *Client
	ns, id   string
	deadline time.Duration
	// root is the containers' root; images CRIU's image directory; dump
	// and restore CRIU's work directories; netns the pinned network
	// namespace (none with userns, the range of the containers' user
	// namespace).
	root, images, dump, restore, netns string
	userns                             *idmap.Range
	// extra are more options of the containers' spec.
	extra []oci.SpecOpts
}

// makeRoot makes the containers' root: the mount points, and the
// top-level links into /usr (bound from the host) that a merged-/usr
// system has.
func (p *containerProbe) makeRoot() error {
	for _, d := range []string{"usr", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(p.root, d), 0o755); err != nil {
			return err
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(p.root, l)); err != nil {
			return err
		}
	}
	return nil
}

// start makes the probe's container in a fresh network namespace and
// starts its task, or, with restoreFrom, restores it from those images.
// On an error nothing of the container is left.
func (p *containerProbe) start(ctx context.Context, restoreFrom string) (containerd.Container, containerd.Task, error) {
	c := p.c
	sopts := []oci.SpecOpts{
		oci.WithRootFSPath(p.root),
		oci.WithProcessArgs("/bin/sleep", "600"),
		oci.WithHostname("probe"),
		oci.WithCgroup(path.Join(c.cfg.CgroupParent, p.id)),
		oci.WithAnnotations(map[string]string{criu.ConfAnnotation: c.criu.Conf()}),
		oci.WithMounts([]specs.Mount{{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}}}),
	}
	if p.userns != nil {
		sopts = append(sopts, usernsOpts(*p.userns, unit.NoNetwork, "")...)
	} else {
		if err := removeNetns(p.netns); err != nil {
			return nil, nil, err
		}
		if err := makeNetns(p.netns, true); err != nil {
			return nil, nil, err
		}
		sopts = append(sopts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: p.netns}))
	}
	cont, err := c.client.NewContainer(ctx, p.id,
		containerd.WithRuntime(Runtime, &options.Options{Root: c.cfg.RuncRoot}),
		containerd.WithNewSpec(append(sopts, p.extra...)...))
	if err != nil {
		return nil, nil, err
	}
	var opts []containerd.NewTaskOpts
	if restoreFrom != "" {
		opts = append(opts, containerd.WithRestoreImagePath(restoreFrom), containerd.WithRestoreWorkPath(p.restore))
	}
	task, err := cont.NewTask(ctx, cio.NullIO, opts...)
	if err != nil {
		c.removeProbe(ctx, cont, nil)
		return nil, nil, err
	}
	// A restore happens as the task starts (runc restore): CRIU's,
	// under the deadline. A plain start is runc's alone: cancelling
	// it must not kill the shim's helpers (runc start, runc init),
	// which leaves the shim unable to answer.
	timedOut, err := false, error(nil)
	if restoreFrom != "" {
		timedOut, err = c.underDeadlineIn(ctx, shimOf{p.ns, p.id}, p.deadline, func() int { return 0 }, task.Start)
	} else {
		err = task.Start(ctx)
	}
	if err == nil && timedOut {
		err = errors.New("returned as its deadline passed")
	}
	if err == nil && restoreFrom == "" {
		// runc start returns as runc init is told to exec the task,
		// not once it has: a dump before that finds runc init (its
		// binary, a mount of runc's own, is no mount CRIU knows).
		err = execed(int(task.Pid()), "/bin/sleep", p.deadline)
	}
	if err != nil {
		c.removeProbe(ctx, cont, task)
		if timedOut {
			return nil, nil, fmt.Errorf("did not finish within %v: CRIU was killed%s", p.deadline, criu.LogTail(filepath.Join(p.restore, "restore.log")))
		}
		return nil, nil, fmt.Errorf("%w%s", err, criu.LogTail(filepath.Join(p.restore, "restore.log")))
	}
	return cont, task, nil
}

// checkpoint dumps the started container's task into p.images, under the
// deadline, and waits for the dump to end it; then, and on every error,
// it removes the container, so that the restore can make its own under
// the same id.
func (p *containerProbe) checkpoint(ctx context.Context, cont containerd.Container, task containerd.Task) error {
	c := p.c
	exit, err := task.Wait(ctx)
	if err != nil {
		c.removeProbe(ctx, cont, task)
		return fmt.Errorf("container probe: %w", err)
	}
	opts, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{Exit: true, ImagePath: p.images, WorkPath: p.dump})
	if err != nil {
		c.removeProbe(ctx, cont, task)
		return err
	}
	timedOut, err := c.underDeadlineIn(ctx, shimOf{p.ns, p.id}, p.deadline, func() int { return int(task.Pid()) }, func(ctx context.Context) error {
		_, err := c.client.TaskService().Checkpoint(ctx, &tasks.CheckpointTaskRequest{ContainerID: p.id, Options: opts})
		return err
	})
	if err != nil {
		c.removeProbe(ctx, cont, task)
		if timedOut {
			return fmt.Errorf("container probe: the checkpoint did not finish within %v: CRIU was killed%s", p.deadline, criu.LogTail(filepath.Join(p.dump, "dump.log")))
		}
		return fmt.Errorf("container probe: checkpoint: %w%s", err, criu.LogTail(filepath.Join(p.dump, "dump.log")))
	}
	select {
	case <-exit:
	case <-time.After(p.deadline):
		c.removeProbe(ctx, cont, task)
		return errors.New("container probe: the checkpointed task did not exit")
	}
	c.removeProbe(ctx, cont, task)
	return nil
}

// removeProbe kills and deletes a probe's task and container.
func (c *Client) removeProbe(ctx context.Context, cont containerd.Container, task containerd.Task) {
	// Bounded below the 20 s a supervisor gives a stopping daemon: what
	// is left then, the next start's sweep removes.
	limit := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok && ctx.Err() == nil && time.Until(dl) < limit {
		limit = time.Until(dl)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	if task == nil {
		// A NewTask cancelled on the client's side may have made the
		// task on containerd's all the same.
		if t, err := cont.Task(ctx, nil); err == nil {
			task = t
		}
	}
	if task != nil {
		_ = task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
		st, err := task.Status(ctx)
		if err == nil && st.Status == containerd.Paused {
			_ = task.Resume(ctx)
		}
		// A task created and never started (a restore cancelled before
		// its start) sends no exit: wait only for one that ran.
		if err == nil && st.Status != containerd.Created && st.Status != containerd.Stopped {
			if exit, err := task.Wait(ctx); err == nil {
				select {
				case <-exit:
				case <-ctx.Done():
				}
			}
		}
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			c.log.Warn("probe: delete task", "id", cont.ID(), "err", err)
		}
	}
	if err := cont.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		c.log.Warn("probe: delete container", "id", cont.ID(), "err", err)
	}
	// A restore killed mid-way leaves runc's criu-root mounted in its
	// state directory, and what it had restored in its cgroup; and the
	// shim must not outlive the probe.
	c.killCgroup(cont.ID(), 2*time.Second)
	if ns, err := namespaces.NamespaceRequired(ctx); err == nil {
		c.reapShim(ns, cont.ID(), 2*time.Second)
		if err := unmountUnder(filepath.Join(c.cfg.RuncRoot, ns, cont.ID())); err != nil {
			c.log.Warn("probe: unmounting what runc left", "id", cont.ID(), "err", err)
		}
	}
}

// SweepProbes removes every probe container, task and work directory
// there is: a daemon stopping calls it last, so that a probe cut short
// (by the stop, or by an earlier process killed mid-probe) leaves nothing
// running.
func (c *Client) SweepProbes(ctx context.Context) {
	c.sweepProbes(namespaces.WithNamespace(ctx, c.probeNamespace()))
}

// sweepProbes removes what an earlier probe that did not finish (its
// process died) left in the probe namespace and the probe directories.
func (c *Client) sweepProbes(ctx context.Context) {
	conts, err := c.client.Containers(ctx)
	if err == nil {
		for _, cont := range conts {
			task, err := cont.Task(ctx, nil)
			if err != nil {
				task = nil
			}
			c.removeProbe(ctx, cont, task)
		}
	}
	pins, _ := filepath.Glob(filepath.Join(c.cfg.StateDir, "netns-probe", "*"))
	for _, p := range pins {
		_ = removeNetns(p)
	}
	_ = removeTree(filepath.Join(c.cfg.StateDir, "probe"))
}

// execed waits until host pid runs argv0 (its cmdline's first word), for
// at most d.
func execed(pid int, argv0 string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			return fmt.Errorf("the started task: %w", err)
		}
		if first, _, _ := strings.Cut(string(b), "\x00"); first == argv0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the started task did not exec %s within %v", argv0, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killCgroup kills every process in sandbox id's cgroup (thawed first: a
// frozen task takes no signal), for at most d, until none is left.
func (c *Client) killCgroup(id string, d time.Duration) {
	rel := path.Join(c.cfg.CgroupParent, id)
	procs := ""
	for _, f := range []string{filepath.Join("/sys/fs/cgroup/pids", rel, "cgroup.procs"), filepath.Join("/sys/fs/cgroup", rel, "cgroup.procs")} {
		if _, err := os.Stat(f); err == nil {
			procs = f
			break
		}
	}
	if procs == "" {
		return
	}
	_ = c.setFreezer(id, false)
	deadline := time.Now().Add(d)
	for {
		b, err := os.ReadFile(procs)
		pids := strings.Fields(string(b))
		if err != nil || len(pids) == 0 || time.Now().After(deadline) {
			return
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}
