//go:build linux

package executor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/rootfs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// rootfsMounts are the mounts of the sandbox's rw snapshot, with its
// snapshotter and key.
func (s *Sandbox) rootfsMounts(ctx context.Context) (snapshotter, key string, _ []mount.Mount, _ error) {
	info, err := s.cont.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return "", "", nil, err
	}
	mounts, err := s.c.client.SnapshotService(info.Snapshotter).Mounts(ctx, info.SnapshotKey)
	if err != nil {
		return "", "", nil, err
	}
	return info.Snapshotter, info.SnapshotKey, mounts, nil
}

// exportRootfs writes the diff of the sandbox's rw snapshot against its
// image to path, at most budget bytes of it ([ErrTooLarge] at the first
// byte over, and nothing left at path). From an overlayfs snapshot it is
// read off the snapshot's upper directory (rwlayer.go): its cost follows
// the change, not the image. Otherwise the diff service computes it.
//
// A sandbox with a user namespace has its rw layer in host ids: the tar
// is rewritten with in-namespace ids (shiftFile), so none of this host's
// leaves it.
func (s *Sandbox) exportRootfs(ctx context.Context, path string, budget int64) (int64, error) {
	base, userns, err := s.userBase(ctx)
	if err != nil {
		return 0, err
	}
	n, err := s.exportHostRootfs(ctx, path, budget)
	if err != nil || !userns {
		return n, err
	}
	return shiftFile(path, base, budget)
}

func (s *Sandbox) exportHostRootfs(ctx context.Context, path string, budget int64) (int64, error) {
	// The task is frozen (Keep) or has exited, its root still mounted:
	// the upper directory holds every change and none is being made.
	snapshotter, key, mounts, err := s.rootfsMounts(ctx)
	if err != nil {
		return 0, err
	}
	n, err := writeOverlayDiffFile(ctx, mounts, path, budget)
	if !errors.Is(err, errNoUpperDir) {
		return n, err
	}
	s.c.log.Debug("rw layer through the diff service", "sandbox", s.id, "reason", err)
	return s.c.diffServiceLayer(ctx, snapshotter, key, path, budget)
}

// shiftFile rewrites the layer tar at path with its owners moved from the
// range at base to in-namespace ids (shiftTar), whole, within budget.
func shiftFile(path string, base uint32, budget int64) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sh := shifted(bufio.NewReaderSize(f, 1<<20), base, 0)
	defer sh.Close()
	return writeFileWhole(path, budgeted(sh, budget), false)
}

// diffServiceLayer writes the diff of snapshot key (of snapshotter)
// against its parent to path, computed by containerd's diff service (which
// walks both whole trees) into the content store under a lease; it is
// copied out, and the lease's end lets the GC take the blob.
//
// The diff service writes the whole layer before this can count it: the
// caller has measured the snapshot first (checkRootfs), which bounds it.
func (c *Client) diffServiceLayer(ctx context.Context, snapshotter, key, path string, budget int64) (int64, error) {
	ctx, done, err := c.client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		return 0, err
	}
	defer done(context.WithoutCancel(ctx))
	desc, err := rootfs.CreateDiff(ctx, key, c.client.SnapshotService(snapshotter), c.client.DiffService(),
		diff.WithMediaType(ocispec.MediaTypeImageLayer),
		diff.WithReference("runrecordd-rootfs-"+key))
	if err != nil {
		return 0, err
	}
	ra, err := c.client.ContentStore().ReaderAt(ctx, desc)
	if err != nil {
		return 0, err
	}
	defer ra.Close()
	if desc.Size > budget {
		return 0, fmt.Errorf("%w: the rw layer is %d bytes, over its budget of %d", ErrTooLarge, desc.Size, budget)
	}
	return writeFileWhole(path, budgeted(content.NewReader(ra), budget), false)
}
