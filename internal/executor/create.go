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
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
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
	// criuConfig, when set, is the CRIU configuration file the restored
	// container's criu.ConfAnnotation names instead of the client's (a
	// lazy restore's, lazy.go).
	criuConfig string
	// staged, when set, yields the staging's error once the images are
	// staged (restore.go); awaitStaged takes it into stageErr.
	staged   <-chan error
	stageErr error
	// abort, when it closes, ends the restore as its deadline would
	// (a lazy restore whose lazy-pages failed, lazy.go).
	abort <-chan struct{}

	rootfsTime, taskTime, newTaskTime time.Duration // set by create
	timedOut                          bool          // set by create: the deadline passed
}

// create makes sandbox id and starts its task, or, with rs, restores it.
func (c *Client) create(ctx context.Context, id string, spec Spec, out Output, rs *restoreFrom) (*Sandbox, error) {
	return c.build(ctx, id, spec, out, buildOpts{restore: rs, start: true})
}

// buildOpts is how build makes a sandbox beyond its spec and output.
type buildOpts struct {
	restore *restoreFrom   // restore the task from these images; nil: a new task
	start   bool           // start the task; otherwise only create it
	extra   []oci.SpecOpts // OCI spec options after the spec's own
}

// build makes sandbox id, its task started when o.start is set (create),
// only created otherwise (Create, prepared.go), restored from o.restore's
// images when it is set. Its steps run in the order each needs what the one before made: the
// spec checked and the image ready before anything is made; the rw
// snapshot (a restore's), the network namespace and the grant overlays
// before the container that names them; the container before its task.
// When a step fails, what the steps before it made is undone, last
// first, so that a failed create leaves nothing behind.
func (c *Client) build(ctx context.Context, id string, spec Spec, out Output, o buildOpts) (_ *Sandbox, retErr error) {
	ctx, rs := c.ctx(ctx), o.restore
	spec, err := c.checkSpec(id, spec)
	if err != nil {
		return nil, err
	}
	img, err := c.readyImage(ctx, spec)
	if err != nil {
		return nil, err
	}
	if _, err := c.client.LoadContainer(ctx, id); err == nil {
		return nil, fmt.Errorf("%w: a container named %s", ErrExists, id)
	}
	// A snapshot of this id with no container is what a create cut short
	// (a daemon killed in it) left, kept by its lease: it goes.
	if err := c.client.SnapshotService(Snapshotter).Remove(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("the snapshot an earlier create of %s left: %w", id, err)
	}

	snapshot := containerd.WithNewSnapshot(id, img)
	if rs != nil || spec.UserNS != nil {
		// The snapshot is made before its container; a lease until the
		// container exists keeps the GC (which runs on every deletion)
		// from taking it in between (a remapped snapshot's active
		// "-remap" key too, before it is committed).
		lctx, done, err := c.client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
		if err != nil {
			return nil, fmt.Errorf("lease: %w", err)
		}
		defer done(context.WithoutCancel(ctx))
		ctx = lctx
	}
	if rs == nil && spec.UserNS != nil {
		if err := c.remappedSnapshot(ctx, id, img, *spec.UserNS); err != nil {
			return nil, fmt.Errorf("remapped snapshot: %w", err)
		}
		defer onFailure(&retErr, func() { _ = c.client.SnapshotService(Snapshotter).Remove(context.WithoutCancel(ctx), id) })
		snapshot = containerd.WithSnapshot(id)
	}
	if rs != nil {
		undo, err := c.restoreSnapshot(ctx, id, img, rs, spec.UserNS)
		if err != nil {
			return nil, err
		}
		defer onFailure(&retErr, undo)
		snapshot = containerd.WithSnapshot(id)
	}
	var link *linkServer
	if spec.UserNS == nil { // with one, runc makes it (userns.go)
		undo, err := c.sandboxNetns(id, spec.Network)
		if err != nil {
			return nil, err
		}
		defer onFailure(&retErr, undo)
		if spec.Network == unit.Egress {
			t0 := time.Now()
			if err := spec.Link(c.netnsPath(id)); err != nil {
				return nil, fmt.Errorf("network: link out: %w", err)
			}
			c.log.Debug("network: linked out", "id", id, "took", time.Since(t0))
		}
	} else if spec.Network == unit.Egress {
		// The hook asks for the link once runc (or CRIU) made the
		// namespace (link.go).
		if link, err = c.serveLink(id, spec.Link); err != nil {
			return nil, err
		}
		defer link.close()
	}
	var undo func()
	if spec.Mounts, undo, err = c.sandboxGrants(id, spec.Mounts, spec.UserNS); err != nil {
		return nil, err
	}
	defer onFailure(&retErr, undo)
	extra := o.extra
	if rs != nil && rs.criuConfig != "" {
		extra = append(extra, oci.WithAnnotations(map[string]string{criu.ConfAnnotation: rs.criuConfig}))
	}
	s, err := c.newContainer(ctx, id, containerOf{img: img, snapshot: snapshot, spec: spec, extra: extra}, out)
	if err != nil {
		return nil, err
	}
	defer onFailure(&retErr, func() { s.undoCreate(ctx, rs) })
	if rs != nil {
		// The images judged against the spec runc restores them under
		// (criu.ErrRefused), before runc restores the task.
		t0 := time.Now()
		if err := s.judgeImages(ctx, rs); err != nil {
			return nil, err
		}
		c.log.Debug("restore: images checked", "id", id, "took", time.Since(t0))
	}
	if err := s.startTask(ctx, out, rs, o.start); err != nil {
		return nil, errors.Join(err, link.close())
	}
	if link != nil {
		if err := link.close(); err != nil {
			return nil, err
		}
		c.log.Debug("network: linked out by the hook", "id", id, "took", link.took)
	}
	return s, nil
}

// onFailure runs undo when *errp holds an error: deferred by create after
// each step that made something, it undoes the steps, last first, of a
// create that failed.
func onFailure(errp *error, undo func()) {
	if *errp != nil {
		undo()
	}
}

// checkSpec checks the sandbox id and spec, mount sources included, and
// returns the spec with its defaults: first of all, as it needs nothing
// from containerd and refuses hostile input before anything is made.
func (c *Client) checkSpec(id string, spec Spec) (Spec, error) {
	if err := identifiers.Validate(id); err != nil {
		return spec, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := spec.validate(); err != nil {
		return spec, err
	}
	spec = spec.withDefaults()
	for _, m := range spec.Mounts {
		if err := c.checkSource(m); err != nil {
			return spec, err
		}
	}
	return spec, nil
}

// readyImage finds the spec's image, checks its digest when the spec
// names one, and unpacks it into the snapshotter if it is not yet: before
// anything is made for the sandbox, since every later step needs it.
func (c *Client) readyImage(ctx context.Context, spec Spec) (containerd.Image, error) {
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
	return img, nil
}

// restoreSnapshot makes a restore's rw snapshot over the image with the
// checkpoint's rw layer applied (prepareRootfs), under the caller's lease,
// and returns how to remove it. It comes before the container, which is
// made over it.
func (c *Client) restoreSnapshot(ctx context.Context, id string, img containerd.Image, rs *restoreFrom, r *idmap.Range) (undo func(), _ error) {
	t0 := time.Now()
	if err := c.prepareRootfs(ctx, id, img, rs.rootfs, r); err != nil {
		return nil, err
	}
	rs.rootfsTime = time.Since(t0)
	return func() { _ = c.client.SnapshotService(Snapshotter).Remove(ctx, id) }, nil
}

// sandboxNetns pins a fresh network namespace for sandbox id, loopback up
// or down as network says, and returns how to remove it. A pin already
// there was left by a process that died between making it and creating
// the container (the caller has checked that no container has this id):
// it is removed first.
func (c *Client) sandboxNetns(id string, network unit.Network) (undo func(), _ error) {
	netns := c.netnsPath(id)
	if err := removeNetns(netns); err != nil {
		return nil, err
	}
	if err := makeNetns(netns, network == unit.Loopback || network == unit.Egress); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	return func() {
		if err := removeNetns(netns); err != nil {
			c.log.Warn("cleanup after failed create", "id", id, "err", err)
		}
	}, nil
}

// sandboxGrants replaces what an earlier sandbox of this id left of its
// grants, then makes mounts' overlays: read-only grants of directories go
// through overlays, and with a user namespace's range r every mount is
// idmapped to it (grants.go). It returns the mounts to give the
// container and how to remove the overlays.
func (c *Client) sandboxGrants(id string, mounts []Mount, r *idmap.Range) (_ []Mount, undo func(), _ error) {
	if err := c.removeGrants(id); err != nil {
		return nil, nil, err
	}
	mounts, err := c.overlayGrants(id, mounts, r)
	if err != nil {
		return nil, nil, err
	}
	return mounts, func() {
		if err := c.removeGrants(id); err != nil {
			c.log.Warn("cleanup after failed create", "id", id, "err", err)
		}
	}, nil
}

// containerOf is what newContainer makes a sandbox's container of.
type containerOf struct {
	img      containerd.Image
	snapshot containerd.NewContainerOpts // the rw snapshot over img
	spec     Spec
	extra    []oci.SpecOpts // OCI spec options after spec's own
}

// newContainer makes sandbox id's container over of.snapshot, with the
// OCI spec of of.spec (specOpts, then of.extra) and labels that let
// [Client.Load] find its output files and limits again.
func (c *Client) newContainer(ctx context.Context, id string, of containerOf, out Output) (*Sandbox, error) {
	spec := of.spec
	cont, err := c.client.NewContainer(ctx, id,
		containerd.WithImage(of.img),
		containerd.WithSnapshotter(Snapshotter),
		of.snapshot,
		containerd.WithRuntime(Runtime, &options.Options{Root: c.cfg.RuncRoot}),
		containerd.WithNewSpec(append(c.specOpts(of.img, id, spec), of.extra...)...),
		containerd.WithContainerLabels(map[string]string{
			labelStdout: out.Stdout, labelStderr: out.Stderr,
			labelLogBytes:    strconv.FormatUint(spec.LogBytes, 10),
			labelRootfsBytes: strconv.FormatUint(spec.RootfsBytes, 10),
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	return &Sandbox{c: c, id: id, cont: cont, logBytes: spec.LogBytes, rootfsBytes: spec.RootfsBytes}, nil
}

// undoCreate removes a sandbox whose create failed once its container
// existed, and, after a restore, unmounts what a CRIU killed mid-restore
// left.
func (s *Sandbox) undoCreate(ctx context.Context, rs *restoreFrom) {
	c, id := s.c, s.id
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

// startTask creates the container's task, its output copied into out's
// files, and starts it (with rs, restores it from rs's images) when start
// is set. The exit is watched between the two, so that no exit of a
// started task can be missed.
func (s *Sandbox) startTask(ctx context.Context, out Output, rs *restoreFrom, start bool) error {
	stdout, stderr, err := s.openOutput(out)
	if err != nil {
		return err
	}
	creator := cio.NewCreator(cio.WithStreams(nil, stdout, stderr), cio.WithFIFODir(filepath.Join(s.c.cfg.StateDir, "fifo")))
	taskStart := time.Now()
	var taskOpts []containerd.NewTaskOpts
	if rs != nil {
		taskOpts = append(taskOpts, containerd.WithRestoreImagePath(rs.images), containerd.WithRestoreWorkPath(rs.work))
	}
	var task containerd.Task
	if err := s.c.boundRestore(ctx, s.id, rs, func(ctx context.Context) (err error) {
		task, err = s.cont.NewTask(ctx, creator, taskOpts...)
		return err
	}); err != nil {
		return fmt.Errorf("task: %w", err)
	}
	s.task = task
	if rs != nil {
		rs.newTaskTime = time.Since(taskStart)
	}
	// The exit channel must outlive the caller's ctx: it is how Destroy
	// and Checkpoint learn that the process has gone.
	exit, err := task.Wait(s.c.ctx(context.WithoutCancel(ctx)))
	if err != nil {
		return fmt.Errorf("task wait: %w", err)
	}
	s.watch(exit)
	if !start {
		return nil
	}
	if err := s.c.boundRestore(ctx, s.id, rs, task.Start); err != nil {
		return fmt.Errorf("task start: %w", err)
	}
	if rs != nil {
		rs.taskTime = time.Since(taskStart)
	}
	return nil
}

// boundRestore runs call, a step of the task's creation or start: without
// rs plainly, with rs under rs's deadline. A restore is CRIU's, under the
// deadline: containerd's shim runs runc restore when the task is started
// (and a shim that did it at creation would be covered too).
func (c *Client) boundRestore(ctx context.Context, id string, rs *restoreFrom, call func(context.Context) error) error {
	if rs == nil {
		return call(ctx)
	}
	wctx := ctx // ends the restore once done (underDeadline)
	if rs.abort != nil {
		var stop context.CancelFunc
		wctx, stop = context.WithCancel(ctx)
		defer stop()
		go func() {
			select {
			case <-rs.abort:
				stop()
			case <-wctx.Done():
			}
		}()
	}
	timedOut, err := c.underDeadline(wctx, id, rs.deadline, func() int { return 0 }, call)
	if timedOut && ctx.Err() == nil && wctx.Err() != nil {
		return fmt.Errorf("restore ended: %w", err) // aborted, not timed out
	}
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
