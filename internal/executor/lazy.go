//go:build linux

package executor

// Issue 15's lazy image resume (docs/lazy-resume.md): a restore whose
// memory arrives on fault and in the background from a `criu lazy-pages`
// daemon. The image form calls it when the daemon runs with
// --lazy-resume (internal/forms, lazy.go); bench/lazybench measures it.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/failpoint"
)

// LazyRestoring reports whether sandbox id's lazy restore is still
// serving pages (pageserver.Pids.Serving).
func (c *Client) LazyRestoring(id string) bool { return c.lazyPids(id).Serving() }

// LazyUnfinished reports whether sandbox id was restored lazily and its
// lazy-pages was not seen to bring every page in
// (pageserver.Pids.Unfinished).
func (c *Client) LazyUnfinished(id string) bool { return c.lazyPids(id).Unfinished() }

// lazyPids is where sandbox id's lazy restore records its processes.
func (c *Client) lazyPids(id string) pageserver.Pids {
	return pageserver.Pids{Dir: c.criu.Of(id), Work: c.criu.Restore(id)}
}

// RestoreLazy is [Client.Restore] with lazy pages: it returns as soon as
// the unit runs, its registers, files, sockets and eager memory (file
// mappings, stacks) restored, with the daemon that serves the rest. The
// caller must keep watching it: an error from [LazyPages.Result] means the
// unit's memory is incomplete, and its sandbox must be destroyed.
//
// The sandbox's CRIU configuration is a file of its own (its
// criu.ConfAnnotation), criu.LazyConf during the restore, rewritten to
// criu.Conf once it is done, so that a later dump of the sandbox is an
// ordinary one.
func (c *Client) RestoreLazy(ctx context.Context, id string, spec Spec, cp Checkpoint, out Output) (*Sandbox, *pageserver.LazyPages, RestoreStats, error) {
	s, l, st, err := c.restoreLazy(ctx, id, spec, cp, out)
	if err != nil {
		return nil, nil, RestoreStats{}, fmt.Errorf("executor: lazy restore %s: %w", id, err)
	}
	return s, l, st, nil
}

func (c *Client) restoreLazy(ctx context.Context, id string, spec Spec, cp Checkpoint, out Output) (*Sandbox, *pageserver.LazyPages, RestoreStats, error) {
	start := time.Now()
	images, work, err := c.restoreWork(id, cp, spec.UserNS)
	if err != nil {
		return nil, nil, RestoreStats{}, err
	}
	if err := c.criu.WriteConfOf(id, criu.LazyConf); err != nil {
		return nil, nil, RestoreStats{}, err
	}
	// The image directory itself: a staged one's pages are detached
	// once the restore returns (unstage).
	orig, err := filepath.Abs(cp.ImageDir)
	if err != nil {
		return nil, nil, RestoreStats{}, err
	}
	l, err := pageserver.StartLazyPages(pageserver.LazyOptions{CRIU: c.cfg.CRIU, Images: orig, Work: work, Pages: cp.Pages, Wait: 10 * time.Second})
	if err != nil {
		return nil, nil, RestoreStats{}, fmt.Errorf("%w: %w", ErrRestore, err)
	}
	if err := c.lazyPids(id).Record(l); err != nil {
		l.Kill()
		return nil, nil, RestoreStats{}, err
	}
	rs := &restoreFrom{images: images, rootfs: cp.Rootfs, work: work, deadline: cp.Deadline, criuConfig: c.criu.ConfOf(id)}
	s, err := c.create(ctx, id, spec, out, rs)
	unstage(c, id, spec, images)
	if err == nil {
		failpoint.Fire("lazy.restored")
		// Later dumps of this sandbox are eager ones.
		if err = c.criu.WriteConfOf(id, criu.Conf); err != nil {
			err = errors.Join(err, s.destroy(context.WithoutCancel(ctx)))
		}
	}
	if err != nil {
		l.Kill()
		return nil, nil, RestoreStats{}, restoreFailed(rs, err)
	}
	l.SetUnit(int(s.Pid()))
	return s, l, rs.stats(start), nil
}
