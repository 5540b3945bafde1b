//go:build linux

package executor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
)

// RestoreStats is what a restore cost.
type RestoreStats struct {
	// Total is the whole Restore call; Rootfs the rw layer's apply; Task
	// the task create and start (runc restore and CRIU), of which NewTask
	// the create (containerd and its shim; the start runs runc restore).
	Total, Rootfs, Task, NewTask time.Duration
	// Forking and Restore are CRIU's timings from stats-restore: forking
	// the process tree, and the rest of the restore.
	Forking, Restore time.Duration
	// PagesRestored is how many memory pages CRIU restored.
	PagesRestored uint64
}

// Restore creates sandbox id from the same spec as the checkpointed one,
// with the rw layer cp.Rootfs applied over the image, and restores its
// processes from cp.ImageDir; output goes on into out's files. CRIU only
// reads the image directory (its log and stats-restore go to the work
// directory under the executor's state), so cp.ImageDir may be a sealed
// object.
func (c *Client) Restore(ctx context.Context, id string, spec Spec, cp Checkpoint, out Output) (*Sandbox, RestoreStats, error) {
	s, st, err := c.restore(ctx, id, spec, cp, out)
	if err != nil {
		return nil, RestoreStats{}, fmt.Errorf("executor: restore %s: %w", id, err)
	}
	return s, st, nil
}

// The images are staged (stage) while create makes the sandbox they are
// restored into (the rw snapshot, the container: containerd's work,
// mostly): the check, the first step that reads them, waits for them
// (judgeImages), and so does unstage.
func (c *Client) restore(ctx context.Context, id string, spec Spec, cp Checkpoint, out Output) (*Sandbox, RestoreStats, error) {
	start := time.Now()
	src, work, err := c.restoreDirs(id, cp)
	if err != nil {
		return nil, RestoreStats{}, err
	}
	images := filepath.Join(work, "images")
	staged := make(chan error, 1)
	go func() {
		_, err := stage(src, work, spec.UserNS)
		staged <- err
	}()
	rs := &restoreFrom{images: images, rootfs: cp.Rootfs, work: work, deadline: cp.Deadline, staged: staged}
	s, err := c.create(ctx, id, spec, out, rs)
	if serr := rs.awaitStaged(); err == nil {
		err = serr
	}
	unstage(c, id, spec, images)
	if err != nil {
		return nil, RestoreStats{}, restoreFailed(rs, err)
	}
	return s, rs.stats(start), nil
}

// judgeImages refuses a restore's images (criu.Read, the staged image
// directory rs.images, once staged: a staging's error is the check's)
// that grant more than the sandbox they are restored into (criu.PolicyOf
// its container's OCI spec, the one runc restores it under): a refusal
// wraps criu.ErrRefused and names the task and field.
// Images it passes it rewrites so that every task is restored within the
// spec's limits and oom_score_adj (criu.Images.Narrow) and, under a spec
// with a seccomp profile, every thread with the profile's filter, as
// this host's runc compiles it (specFilters), installed before its own
// (criu.Images.Stack).
func (s *Sandbox) judgeImages(ctx context.Context, rs *restoreFrom) error {
	if err := rs.awaitStaged(); err != nil {
		return err
	}
	dir := rs.images
	spec, err := s.cont.Spec(ctx)
	if err != nil {
		return fmt.Errorf("the container's spec: %w", err)
	}
	p, err := criu.PolicyOf(spec)
	if err != nil {
		return err
	}
	im, err := criu.Read(dir)
	if err != nil {
		return err
	}
	if err := im.Judge(p); err != nil {
		return err
	}
	if err := im.Narrow(dir, p); err != nil {
		return err
	}
	if !p.Seccomp {
		return nil
	}
	host, err := s.c.specFilters(ctx, spec.Linux.Seccomp)
	if err != nil {
		return err
	}
	return im.Stack(dir, host)
}

// restoreDirs checks that cp's image directory holds a CRIU image, and
// makes the restore's work directory under the executor's state, empty:
// cp's image directory (absolute) and the work directory. The images CRIU
// reads are staged there (stage): cp's image directory is never written
// (it may be sealed), and the check rewrites what it restores
// (judgeImages).
func (c *Client) restoreDirs(id string, cp Checkpoint) (images, work string, err error) {
	if cp.ImageDir == "" {
		return "", "", fmt.Errorf("%w: no image directory", ErrInvalid)
	}
	if images, err = filepath.Abs(cp.ImageDir); err != nil {
		return "", "", err
	}
	if _, err := os.Stat(filepath.Join(images, "inventory.img")); err != nil {
		return "", "", fmt.Errorf("%w: %s holds no CRIU image: %w", ErrInvalid, images, err)
	}
	work = c.criu.Restore(id)
	if err := removeTree(work); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return "", "", err
	}
	return images, work, nil
}

// stage stages the image directory images under work, for a restore
// into r's range (stageImages: copies with r's range in their user
// namespace image) or, without r, into the host's ids (linkImages:
// links): the directory work/images.
func stage(images, work string, r *idmap.Range) (string, error) {
	if r != nil {
		return stageImages(images, work, *r)
	}
	return linkImages(images, work)
}

// awaitStaged waits for the images of a restore that staged them while
// its sandbox was made (rs.staged), once: whether they were.
func (rs *restoreFrom) awaitStaged() error {
	if rs.staged != nil {
		rs.stageErr = <-rs.staged
		rs.staged = nil
	}
	return rs.stageErr
}

// linkImages is the image directory a restore without a user namespace
// reads: a new directory under work with a hard link to each file of
// images (a copy where a link cannot be made: another filesystem). The
// images the check rewrites replace their links there.
func linkImages(images, work string) (string, error) {
	dst := filepath.Join(work, "images")
	if err := os.Mkdir(dst, 0o700); err != nil {
		return "", err
	}
	des, err := os.ReadDir(images)
	if err != nil {
		return "", err
	}
	if len(des) > criu.MaxFiles {
		return "", fmt.Errorf("%w: %d image files, the limit is %d", criu.ErrRefused, len(des), criu.MaxFiles)
	}
	for _, de := range des {
		if !de.Type().IsRegular() {
			return "", &criu.RefusedError{Image: de.Name(), Why: "not a regular file"}
		}
		from, to := filepath.Join(images, de.Name()), filepath.Join(dst, de.Name())
		err := os.Link(from, to)
		if errors.Is(err, syscall.EXDEV) {
			err = copyFile(from, to, 0, 0o400)
		}
		if err != nil {
			return "", err
		}
	}
	return dst, nil
}

// restoreFailed is a restore's error: its deadline's, CRIU's with the
// tail of its log, or the images' refusal (criu.ErrRefused: CRIU never
// ran).
func restoreFailed(rs *restoreFrom, err error) error {
	if errors.Is(err, criu.ErrRefused) {
		return err
	}
	if rs.timedOut {
		return timeoutErr(ErrRestoreTimeout, rs.deadline, err)
	}
	return fmt.Errorf("%w: %w%s", ErrRestore, err, criu.LogTail(filepath.Join(rs.work, "restore.log")))
}

// stats are a restore's times since start, with CRIU's own.
func (rs *restoreFrom) stats(start time.Time) RestoreStats {
	st := RestoreStats{Rootfs: rs.rootfsTime, Task: rs.taskTime, NewTask: rs.newTaskTime}
	cs := criu.ReadRestoreStats(rs.work)
	st.Forking, st.Restore, st.PagesRestored = cs.Forking, cs.Restore, cs.PagesRestored
	st.Total = time.Since(start)
	return st
}

// prepareRootfs makes snapshot key over the image's layers (remapped into
// r's range, with r) and applies the rw layer tar (if any) to it through
// the diff service, its owners moved from in-namespace ids to r's.
func (c *Client) prepareRootfs(ctx context.Context, key string, img containerd.Image, layer string, r *idmap.Range) error {
	sn := c.client.SnapshotService(Snapshotter)
	var mounts []mount.Mount
	if r != nil {
		if err := c.remappedSnapshot(ctx, key, img, *r); err != nil {
			return fmt.Errorf("remapped snapshot: %w", err)
		}
		m, err := sn.Mounts(ctx, key)
		if err != nil {
			_ = sn.Remove(ctx, key)
			return fmt.Errorf("snapshot: %w", err)
		}
		mounts = m
	} else {
		diffIDs, err := img.RootFS(ctx)
		if err != nil {
			return fmt.Errorf("image layers: %w", err)
		}
		if mounts, err = sn.Prepare(ctx, key, identity.ChainID(diffIDs).String()); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	if layer == "" {
		return nil
	}
	if err := c.applyLayer(ctx, key, layer, mounts, r); err != nil {
		_ = sn.Remove(ctx, key)
		return fmt.Errorf("apply rw layer %s: %w", layer, err)
	}
	return nil
}

// applyLayer applies the rw layer tar at layer (shifted into r, when
// given) onto the snapshot key, once vetLayer passes it. The blob is
// committed without an expected digest: given one, containerd's content
// service answers a blob it already holds with AlreadyExists and leases
// nothing, and a collection can remove the blob before the apply reads
// it; without one, the commit leases the blob, new or held, in its
// transaction.
func (c *Client) applyLayer(ctx context.Context, key, layer string, mounts []mount.Mount, r *idmap.Range) error {
	f, err := os.Open(layer)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := vetLayer(f); err != nil {
		return err
	}
	var src io.Reader = bufio.NewReaderSize(f, 1<<20)
	if r != nil {
		sh := shiftedIn(src, r.Base)
		defer sh.Close()
		src = sh
	}
	ctx, done, err := c.client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		return err
	}
	defer done(context.WithoutCancel(ctx))
	// A write of this ref that failed, or whose daemon died, left its
	// ingest: the writer would go on from its end.
	cs, ref := c.client.ContentStore(), "runrecordd-restore-"+key
	if err := cs.Abort(ctx, ref); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	w, err := content.OpenWriter(ctx, cs, content.WithRef(ref))
	if err != nil {
		return err
	}
	defer w.Close()
	dg := digest.Canonical.Digester()
	n, err := io.Copy(io.MultiWriter(w, dg.Hash()), src)
	if err == nil {
		if err = w.Commit(ctx, n, ""); errdefs.IsAlreadyExists(err) {
			err = nil
		}
	}
	if err != nil {
		_ = cs.Abort(context.WithoutCancel(ctx), ref)
		return err
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: dg.Digest(), Size: n}
	_, err = c.client.DiffService().Apply(ctx, desc, mounts)
	return err
}

// unstage removes a staged image directory once CRIU has read it: CRIU
// is done with the pages when the restore returns (a lazy restore's
// daemon serves them from the image directory itself). A user
// namespace's staged pages are mounts: they are detached, the rest stays
// until the next restore's or the sandbox's removal of its work
// directory. Links (linkImages) are removed, so that they hold no object
// the store removes.
func unstage(c *Client, id string, spec Spec, images string) {
	var err error
	if spec.UserNS == nil {
		err = os.RemoveAll(images)
	} else {
		err = unmountUnder(images)
	}
	if err != nil {
		c.log.Warn("restore: unstaging the images", "id", id, "err", err)
	}
}
