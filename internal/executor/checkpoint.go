//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/idmap"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/typeurl/v2"
)

// Checkpoint says where a checkpoint goes, or comes from.
type Checkpoint struct {
	// ImageDir is the CRIU image directory: the memory image and process
	// tree. Checkpoint creates it and wants it absent or empty. Restore
	// only reads it, so it may be a sealed object.
	ImageDir string
	// Rootfs is the tar of the sandbox's rw layer: its diff against the
	// image, in OCI layer form (whiteouts for deletions). Checkpoint writes
	// it whole (temp file, rename) but does not sync it, as CRIU does not
	// sync its images: the caller makes both durable (a park's ingest
	// syncs the filesystem once for everything it stores). Restore applies
	// it. Empty skips the rw layer.
	Rootfs string
	// Keep, on Checkpoint, leaves the task frozen after the dump instead of
	// ending it, so that the caller can store the images and record the
	// park before it destroys the sandbox; a crash in between leaves a unit
	// that [Sandbox.Resume] continues. Without Keep the task exits once
	// dumped.
	Keep bool
	// MaxRootfsBytes, on Checkpoint, lowers the budget of the rw layer
	// tar below the sandbox's own ([Spec].RootfsBytes), as a run's
	// remaining snapshot quota does; 0 leaves the sandbox's. A layer over
	// the budget is refused ([ErrTooLarge]): measured from the snapshot
	// before the dump, and counted again as it is written.
	MaxRootfsBytes int64
	// Deadline bounds CRIU's dump (on Checkpoint) or restore (on Restore);
	// 0 is none. At the deadline CRIU is killed: a checkpoint then fails
	// with [ErrCheckpointTimeout] and the task goes on as it was, a restore
	// with [ErrRestoreTimeout] and nothing of it is left.
	Deadline time.Duration
	// Pages, on RestoreLazy, has the lazy pages served by a page server
	// process (internal/criu/pageserver) from the files it names, each chunk
	// verified before its first page goes, instead of read by lazy-pages
	// from ImageDir's pages files (which then need hold only the eager
	// pages). Nil: lazy-pages reads ImageDir.
	Pages *pageserver.Table
}

// CheckpointStats is what a checkpoint cost.
type CheckpointStats struct {
	// Total is the whole Checkpoint call; Pause the freeze before the
	// dump; Dump the task checkpoint call (runc and CRIU); Diff the rw
	// layer export.
	Total, Pause, Dump, Diff time.Duration
	// Freezing, Frozen, MemDump and MemWrite are CRIU's own timings from
	// stats-dump: time to freeze the tree, time it stayed frozen, time to
	// collect and to write the memory pages.
	Freezing, Frozen, MemDump, MemWrite time.Duration
	// Pages scanned, written, and skipped as unchanged since a parent image.
	PagesScanned, PagesWritten, PagesSkippedParent uint64
	// ImageBytes is the size of the files in ImageDir; RootfsBytes of the
	// rw layer tar.
	ImageBytes, RootfsBytes int64
}

// Checkpoint freezes the sandbox, dumps it with CRIU into cp.ImageDir
// through containerd's task checkpoint with an image path (the memory image
// never passes through the content store), then exports the rw layer to
// cp.Rootfs. After it returns the task has exited (or, with cp.Keep, is
// frozen); destroy the sandbox, or with Keep resume it.
//
// If the dump fails the task is thawed and keeps running. If the rw layer
// export fails after a dump without Keep, the task has already exited: the
// sandbox is still there to destroy, and its images are in cp.ImageDir.
// Keep avoids that window, so a park that must never lose a running unit
// checkpoints with Keep.
func (s *Sandbox) Checkpoint(ctx context.Context, cp Checkpoint) (CheckpointStats, error) {
	st, err := s.checkpoint(s.c.ctx(ctx), cp)
	if err != nil {
		return CheckpointStats{}, fmt.Errorf("executor: checkpoint %s: %w", s.id, err)
	}
	return st, nil
}

// checkpoint is Checkpoint. Its steps run in the order that keeps the
// unit safe: everything that can be checked without touching the task
// first (the directories); then the freeze, which the rw layer's
// measure needs (a layer over its budget refuses the checkpoint before
// CRIU costs anything, the task as it was); then the dump; and the rw
// layer's export only once the task is frozen for good or gone, so that
// the layer holds every change. A step that fails after the freeze puts
// the task back to running where it still can (settle).
func (s *Sandbox) checkpoint(ctx context.Context, cp Checkpoint) (CheckpointStats, error) {
	start := time.Now()
	var st CheckpointStats
	dir, work, err := s.dumpDirs(cp)
	if err != nil {
		return st, err
	}
	_, userns, err := s.userBase(ctx)
	if err != nil {
		return st, err
	}
	// Freeze first, through runc: CRIU then finds the cgroup frozen and
	// leaves it so. Its own freezer polls the cgroup state in 100 ms steps,
	// runc's in microseconds, so this is the faster freeze; it is also the
	// state Keep wants to leave the task in.
	pauseStart := time.Now()
	if err := freeze(ctx, s.task.Pause); err != nil {
		return st, fmt.Errorf("pause: %w", err)
	}
	st.Pause = time.Since(pauseStart)
	budget := s.rootfsBudget(cp)
	if cp.Rootfs != "" {
		// Measured frozen, before CRIU costs anything: a layer over
		// the budget refuses the checkpoint with the task as it was.
		if err := s.checkRootfs(ctx, budget); err != nil {
			return st, errors.Join(fmt.Errorf("%w: rw layer: %w", ErrCheckpoint, err), s.settle(ctx, false))
		}
	}
	if st.Dump, err = s.dump(ctx, cp, dir, work); err != nil {
		return st, err
	}
	if !cp.Keep {
		if err := s.awaitDumpExit(ctx); err != nil {
			return st, err
		}
	}
	if userns {
		// The range is this host's: the images keep host base 0, and
		// a restore puts its own range in (stageImages).
		if err := criu.Remap(dir, 0, idmap.Size); err != nil {
			err = fmt.Errorf("%w: the user namespace's image: %w", ErrCheckpoint, err)
			if cp.Keep {
				err = errors.Join(err, s.settle(ctx, false))
			}
			return st, err
		}
	}
	if cp.Rootfs != "" {
		diffStart := time.Now()
		st.RootfsBytes, err = s.exportRootfs(ctx, cp.Rootfs, budget)
		st.Diff = time.Since(diffStart)
		if err != nil {
			return st, s.exportFailed(ctx, cp, err)
		}
	}
	ds, err := criu.ReadDumpStats(work)
	if err != nil {
		return st, err
	}
	st.Freezing, st.Frozen, st.MemDump, st.MemWrite = ds.Freezing, ds.Frozen, ds.MemDump, ds.MemWrite
	st.PagesScanned, st.PagesWritten, st.PagesSkippedParent = ds.PagesScanned, ds.PagesWritten, ds.PagesSkippedParent
	st.ImageBytes, err = dirSize(dir)
	if err != nil {
		return st, err
	}
	st.Total = time.Since(start)
	return st, nil
}

// dumpDirs makes the checkpoint's image directory (absent or empty) and a
// fresh CRIU work directory under the executor's state, and checks that
// the rw layer's directory exists: before the task is touched, since after
// a dump without Keep the task is gone.
func (s *Sandbox) dumpDirs(cp Checkpoint) (dir, work string, _ error) {
	dir, err := emptyDir(cp.ImageDir)
	if err != nil {
		return "", "", err
	}
	if cp.Rootfs != "" {
		// Checked before the dump: after it, without Keep, the task is gone.
		if fi, err := os.Stat(filepath.Dir(cp.Rootfs)); err != nil || !fi.IsDir() {
			return "", "", fmt.Errorf("%w: no directory for the rw layer %s", ErrInvalid, cp.Rootfs)
		}
	}
	repaired, err := s.c.criu.RepairConfOf(s.id)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	if repaired {
		s.c.log.Warn("repaired a sandbox's CRIU configuration left as a lazy restore's", "sandbox", s.id)
	}
	work = s.c.criu.Dump(s.id)
	if err := removeTree(work); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return "", "", err
	}
	return dir, work, nil
}

// rootfsBudget is the most the checkpoint's rw layer tar may take: the
// sandbox's own budget, lowered by cp.MaxRootfsBytes.
func (s *Sandbox) rootfsBudget(cp Checkpoint) int64 {
	budget := int64(min(s.rootfsBytes, 1<<62))
	if cp.MaxRootfsBytes > 0 {
		budget = min(budget, cp.MaxRootfsBytes)
	}
	return budget
}

// dump has CRIU dump the frozen task into dir, under cp's deadline, and
// returns how long it took. If the dump fails the task is put back to
// running (settle), CRIU killed first if the deadline passed.
func (s *Sandbox) dump(ctx context.Context, cp Checkpoint, dir, work string) (time.Duration, error) {
	opts, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{
		Exit:      !cp.Keep,
		ImagePath: dir,
		WorkPath:  work,
		OpenTcp:   true, // as the CRIU configuration file says too (criu.Conf)
	})
	if err != nil {
		return 0, errors.Join(err, s.settle(ctx, false))
	}
	// The task service directly, not containerd.Task.Checkpoint, which
	// with an image path adds only a lease, a container lookup, a status
	// call and a thaw of a task that has exited.
	dumpStart := time.Now()
	unit := func() int { return int(s.task.Pid()) }
	timedOut, err := s.c.underDeadline(ctx, s.id, cp.Deadline, unit, func(ctx context.Context) error {
		_, err := s.c.client.TaskService().Checkpoint(ctx, &tasks.CheckpointTaskRequest{ContainerID: s.id, Options: opts})
		return err
	})
	took := time.Since(dumpStart)
	if err != nil {
		if timedOut && ctx.Err() == nil {
			err = timeoutErr(ErrCheckpointTimeout, cp.Deadline, err)
		} else {
			err = fmt.Errorf("%w: %w%s", ErrCheckpoint, err, criu.LogTail(filepath.Join(work, "dump.log")))
		}
		return took, errors.Join(err, s.settle(ctx, timedOut))
	}
	return took, nil
}

// awaitDumpExit waits for the task a dump without Keep ends to exit:
// its rw layer is read only once nothing can change it.
func (s *Sandbox) awaitDumpExit(ctx context.Context) error {
	select {
	case <-s.exited:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%w: the task did not exit after its dump", ErrCheckpoint)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// exportFailed is the error of a checkpoint whose rw layer export failed
// with err: over its budget a checkpoint error; and with Keep the task,
// still there, is put back to running.
func (s *Sandbox) exportFailed(ctx context.Context, cp Checkpoint, err error) error {
	err = fmt.Errorf("rw layer: %w", err)
	if errors.Is(err, ErrTooLarge) {
		err = fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	if cp.Keep {
		err = errors.Join(err, s.settle(ctx, false))
	}
	return err
}

// emptyDir makes dir (absolute) exist and checks that it is empty: a
// checkpoint never writes over another.
func emptyDir(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w: no image directory", ErrInvalid)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	if len(ents) > 0 {
		return "", fmt.Errorf("%w: image directory %s is not empty", ErrInvalid, dir)
	}
	return dir, nil
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			fi, err := e.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}
