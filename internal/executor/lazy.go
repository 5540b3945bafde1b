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

// LazySettled is when sandbox id's lazy restore was seen to bring every
// page in, by whichever daemon process saw it (pageserver.Pids.Settled).
func (c *Client) LazySettled(id string) (time.Time, bool) { return c.lazyPids(id).Settled() }

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
	src, work, err := c.restoreDirs(id, cp)
	if err != nil {
		return nil, nil, RestoreStats{}, err
	}
	if err := c.criu.WriteConfOf(id, criu.LazyConf); err != nil {
		return nil, nil, RestoreStats{}, err
	}
	// The images are staged and lazy-pages started while create makes
	// the sandbox: the check, the first step that reads the images and
	// comes before CRIU's restore connects to lazy-pages, waits for both
	// (judgeImages); l is set once staged yields. From then until the
	// create returns, lazy-pages failing aborts the restore (abortOnFailure).
	var l *pageserver.LazyPages
	staged, failed := make(chan error, 1), make(chan error, 1)
	abort, created := make(chan struct{}), make(chan struct{})
	go func() {
		lp, err := c.startLazy(id, src, work, spec, cp)
		l = lp
		staged <- err
		if lp == nil {
			failed <- nil
			return
		}
		failed <- abortOnFailure(lp, abort, created)
	}()
	images := filepath.Join(work, "images")
	rs := &restoreFrom{images: images, rootfs: cp.Rootfs, work: work, deadline: cp.Deadline, criuConfig: c.criu.ConfOf(id), staged: staged, abort: abort}
	s, err := c.create(ctx, id, spec, out, rs)
	close(created)
	if serr := rs.awaitStaged(); err == nil {
		err = serr
	}
	if lerr := <-failed; err != nil && lerr != nil {
		err = fmt.Errorf("%w (lazy-pages ended during the restore: %v)", err, lerr)
	}
	unstage(c, id, spec, images)
	if err == nil {
		failpoint.Fire("lazy.restored")
		// Later dumps of this sandbox are eager ones.
		if err = c.criu.WriteConfOf(id, criu.Conf); err != nil {
			err = errors.Join(err, s.destroy(context.WithoutCancel(ctx)))
		}
	}
	if err != nil {
		if l != nil {
			l.Kill()
		}
		// Both ended: a record of them would take the sandbox for one
		// restored lazily whose pages are still to come.
		return nil, nil, RestoreStats{}, errors.Join(restoreFailed(rs, err), c.lazyPids(id).Forget())
	}
	l.SetUnit(int(s.Pid()))
	return s, l, rs.stats(start), nil
}

// abortOnFailure closes abort if l fails before created closes: the
// unit's tasks would wait on pages that never come, and the restore with
// them until its deadline. Once created is closed, it returns l's
// failure (nil if none).
func abortOnFailure(l *pageserver.LazyPages, abort chan<- struct{}, created <-chan struct{}) error {
	var lerr error
	select {
	case <-created:
	case <-l.Done():
		if _, lerr = l.Result(); lerr != nil {
			close(abort)
		}
		<-created
	}
	return lerr
}

// startLazy stages the images of src (cp's image directory, absolute)
// under work (stage) and starts lazy-pages on src itself (a staged
// directory's pages are detached once the restore returns: unstage), its
// pids recorded: nil, and nothing left running, when one of them fails.
func (c *Client) startLazy(id, src, work string, spec Spec, cp Checkpoint) (*pageserver.LazyPages, error) {
	if _, err := stage(src, work, spec.UserNS); err != nil {
		return nil, err
	}
	l, err := pageserver.StartLazyPages(pageserver.LazyOptions{CRIU: c.cfg.CRIU, Images: src, Work: work, Pages: cp.Pages, Wait: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	if err := c.lazyPids(id).Record(l); err != nil {
		l.Kill()
		return nil, err
	}
	return l, nil
}
