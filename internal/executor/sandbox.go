//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

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

	// gate is the FIFO of a gated sandbox's gate until Begin (gate.go).
	gate string
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
	if err := freeze(s.c.ctx(ctx), s.task.Pause); err != nil {
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

// freezeTries bounds the freezes [freeze] tries. runc's cgroup v1 freezer
// gives up with "unable to freeze" when the tasks are not all stopped
// within its polls (about 1,000 over some 200 ms), which a loaded host
// sees; it thaws the cgroup before it returns, so another try starts
// from a running task and is safe.
const freezeTries = 4

// freeze runs pause, again after a growing pause (100, 200, 400 ms) while
// it fails with runc's "unable to freeze", up to freezeTries times; any
// other error, or ctx done, ends it.
func freeze(ctx context.Context, pause func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		err := pause(ctx)
		if err == nil || try == freezeTries || !strings.Contains(err.Error(), "unable to freeze") {
			return err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		}
		wait *= 2
	}
}
