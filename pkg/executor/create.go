//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/errdefs"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

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
