//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
)

// budgeted reads r and fails with [ErrTooLarge] at the first byte past
// max.
func budgeted(r io.Reader, max int64) io.Reader { return &budgetReader{r: r, left: max} }

type budgetReader struct {
	r    io.Reader
	left int64
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	if int64(n) > b.left {
		return 0, fmt.Errorf("%w: the rw layer goes past its budget", ErrTooLarge)
	}
	b.left -= int64(n)
	return n, err
}

// layerBound is an upper bound of the size of the rw layer tar of a
// snapshot with these mounts: for every entry of its upper directory (or
// of the directory a bind mount shows, for a snapshot without parent) a
// tar header and room for an extended one, and a regular file's size
// rounded up to a block — its logical size: a sparse file goes into a
// layer whole. Every entry the layer can hold is in the upper directory,
// whichever way it is made. Past max it stops counting.
func layerBound(ctx context.Context, mounts []mount.Mount, max int64) (int64, error) {
	dir := ""
	if len(mounts) == 1 {
		switch m := mounts[0]; m.Type {
		case "overlay":
			for _, opt := range m.Options {
				for _, opt := range strings.Split(opt, ",") {
					if v, ok := strings.CutPrefix(opt, "upperdir="); ok {
						dir = filepath.Clean(v)
					}
				}
			}
		case "bind":
			dir = m.Source
		}
	}
	if !filepath.IsAbs(dir) {
		return 0, fmt.Errorf("rw layer: cannot measure a snapshot with mounts %s", describeMounts(mounts))
	}
	const header, block = 1024, 512
	total := int64(2 * block) // the end-of-archive blocks
	errOver := errors.New("over")
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		total += header
		if e.Type().IsRegular() {
			fi, err := e.Info()
			if err != nil {
				return err
			}
			total += (fi.Size() + block - 1) / block * block
		}
		if total > max {
			return errOver
		}
		return nil
	})
	if err != nil && !errors.Is(err, errOver) {
		return 0, fmt.Errorf("rw layer: measuring %s: %w", dir, err)
	}
	return total, nil
}

// checkRootfs measures the rw layer the sandbox's snapshot would make
// (layerBound) and refuses one over budget with [ErrTooLarge]. The task
// is frozen.
func (s *Sandbox) checkRootfs(ctx context.Context, budget int64) error {
	_, _, mounts, err := s.rootfsMounts(ctx)
	if err != nil {
		return err
	}
	need, err := layerBound(ctx, mounts, budget)
	if err != nil {
		return err
	}
	if need > budget {
		return fmt.Errorf("%w: the rw layer would take up to %d bytes, over its budget of %d", ErrTooLarge, need, budget)
	}
	return nil
}
