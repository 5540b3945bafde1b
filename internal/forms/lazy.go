package forms

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The image form's lazy resume (docs/lazy-resume.md): the unit runs as
// soon as CRIU has restored its registers, files and eager memory, and
// `criu lazy-pages` serves the rest from the laid-out images (hard links
// to the objects the resume's first precondition rehashed) on fault and in
// the background. The form holds a copy of every userfaultfd, so that a
// lazy-pages that dies leaves the unit waiting on its missing pages
// instead of reading zeros, and releases them only once every page is
// resident or the unit is gone.

// LazyRestorer is a lazy restore: a sandbox restored with its memory
// still arriving, and the process that brings it (*executor.Client
// through LazyOf).
type LazyRestorer interface {
	RestoreLazy(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (Sandbox, Pages, executor.RestoreStats, error)
}

// Pages is a lazy restore's `criu lazy-pages` (*pageserver.LazyPages).
type Pages interface {
	// Done is closed once it has exited; Result is then nil when every
	// page is resident, or an error wrapping pageserver.ErrPagesLost.
	Done() <-chan struct{}
	Result() (time.Duration, error)
	ExitedAt() time.Time
	Kill()
	// HoldUffds takes a copy of every userfaultfd it holds; release
	// closes them.
	HoldUffds() (n int, release func(), err error)
}

// executorLazy is what *executor.Client (and a type embedding it, the
// forms.Exec) offers of a lazy restore.
type executorLazy interface {
	RestoreLazy(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (*executor.Sandbox, *pageserver.LazyPages, executor.RestoreStats, error)
}

// LazyOf is ex's lazy restore when on is set and ex has one
// (*executor.Client, or a LazyRestorer: the daemon's unit tests' fake);
// nil otherwise: every image resume is then eager.
func LazyOf(ex any, on bool) LazyRestorer {
	if !on {
		return nil
	}
	switch l := ex.(type) {
	case LazyRestorer:
		return l
	case executorLazy:
		return lazyExec{l}
	}
	return nil
}

type lazyExec struct{ c executorLazy }

func (e lazyExec) RestoreLazy(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (Sandbox, Pages, executor.RestoreStats, error) {
	sb, lp, st, err := e.c.RestoreLazy(ctx, id, spec, cp, out)
	if err != nil {
		return nil, nil, st, err
	}
	return sb, lp, st, nil
}

// pages is a lazily restored unit's memory on its way in.
type pages struct {
	start time.Time     // the restore's start: Resident and PagesLost count from it
	done  chan struct{} // closed once every page is resident, or pages were lost

	mu    sync.Mutex
	entry attest.Entry // what became of them: a resident or a pages-lost entry
	lost  error        // wraps pageserver.ErrPagesLost; nil when every page came
	// journaled is set once the entry is in an interval's journal.
	journaled bool
}

// finish says what became of the pages: all resident (lost nil), or lost;
// or, without said, nothing (the unit went first).
func (p *pages) finish(at time.Time, lost error, said bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !said:
		p.journaled = true // nothing to journal
	case lost == nil:
		p.entry = attest.LifecycleOf(at.UnixNano(), attest.Resident{NS: int64(at.Sub(p.start))})
	default:
		p.entry = attest.LifecycleOf(at.UnixNano(), attest.PagesLost{AfterNS: int64(at.Sub(p.start)), Reason: firstLine(lost)})
	}
	p.lost = lost
	close(p.done)
}

// firstLine is err's message without the log tail that follows it.
func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	s, _, _ = strings.Cut(s, "; end of ")
	return s
}

// PagesDone is closed once a lazily restored unit's every page is
// resident, or its pages were lost; nil for any other unit.
func (u *Unit) PagesDone() <-chan struct{} {
	if u.pages == nil {
		return nil
	}
	return u.pages.done
}

// PagesLost reports whether a lazily restored unit's pages were lost (a
// unit killed then did not exit by itself: the daemon parks it back).
func (u *Unit) PagesLost() bool {
	p := u.pages
	if p == nil {
		return false
	}
	select {
	case <-p.done:
	default:
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost != nil
}

// JournalPages, for a lazily restored unit whose pages are all in or
// lost, journals which into iv — once: a later call journals nothing —
// and returns the loss (wrapping pageserver.ErrPagesLost), nil when every
// page came or they are still coming.
func (u *Unit) JournalPages(iv *interval.Interval) error {
	p := u.pages
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
	default:
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.journaled {
		iv.Journal(p.entry)
		p.journaled = true
	}
	return p.lost
}

// lazyRestoring is whether a sandbox's lazy restore is still serving
// pages (*executor.Client), whoever started it; and whether one was not
// seen to bring every page in.
type lazyRestoring interface {
	LazyRestoring(id string) bool
	LazyUnfinished(id string) bool
	LazySettled(id string) (time.Time, bool)
}

// LazyUnfinished reports whether u, an image unit a restarted daemon
// found, was restored lazily by an earlier daemon process that did not
// see its every page resident (executor.Client.LazyUnfinished). Nothing
// here held its userfaultfds while no daemon ran, so what the unit read
// then is not known: the daemon parks it back at the snapshot it resumed
// from.
func (h Env) LazyUnfinished(u *Unit) bool {
	l, ok := h.Sandboxes.(lazyRestoring)
	return ok && u.Spec.Mode != unit.TranscriptMode && l.LazyUnfinished(u.Sandbox.ID())
}

// LazySettled is when u's lazy restore, by an earlier daemon process, was
// seen to bring every page in (executor.Client.LazySettled): a restarted
// daemon journals it as resident where that process died first.
func (h Env) LazySettled(u *Unit) (time.Time, bool) {
	l, ok := h.Sandboxes.(lazyRestoring)
	if !ok || u.Spec.Mode == unit.TranscriptMode {
		return time.Time{}, false
	}
	return l.LazySettled(u.Sandbox.ID())
}

// awaitPages waits until every page of a lazily restored unit is
// resident: CRIU dumps only the pages a process has, so a park before
// then would store a unit with holes. It returns the loss when pages were
// lost (the park is refused; the daemon parks the run back at the
// snapshot it resumed from). A unit an earlier daemon process restored
// lazily, whose lazy-pages still runs, is refused (ErrPagesArriving):
// this process holds nothing to wait on; once that lazy-pages is gone,
// unseen, the unit's pages are lost (ErrPagesLost).
func (f Image) awaitPages(ctx context.Context, u *Unit) error {
	p := u.pages
	if p == nil {
		l, ok := f.h.Sandboxes.(lazyRestoring)
		switch {
		case !ok:
		case l.LazyRestoring(u.ID):
			return pageserver.ErrPagesArriving
		case l.LazyUnfinished(u.ID):
			return fmt.Errorf("%w: %s", pageserver.ErrPagesLost, RestartedReason)
		}
		return nil
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return fmt.Errorf("waiting for every page of the lazy restore: %w", ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// RestartedReason is why the pages of a lazy restore that a restarted
// daemon found unfinished are lost (LazyUnfinished).
const RestartedReason = "the daemon restarted before every page of the lazy restore was resident"

// restoring is what a wake restores: the run's sandbox id and spec, the
// checkpoint (its Deadline too bounds a lazy restore's pages), the
// output files, and when the wake began.
type restoring struct {
	id    string
	spec  executor.Spec
	cp    executor.Checkpoint
	out   executor.Output
	start time.Time
	lazy  bool // restored lazily, where the host can (Waking.Lazy)
}

// restoreSandbox restores r's sandbox, lazily when the host can and its
// admission said so (Admitted.Lazy).
// A lazy restore's pages are watched from here on: the checkpoint's
// deadline bounds the time to all resident, counted from the restore's
// return.
func (f Image) restoreSandbox(ctx context.Context, r restoring) (Sandbox, executor.RestoreStats, *pages, error) {
	id, spec, cp, out := r.id, r.spec, r.cp, r.out
	if f.h.Lazy == nil || !r.lazy {
		sb, rs, err := f.h.Sandboxes.Restore(ctx, id, spec, cp, out)
		return sb, rs, nil, err
	}
	sb, lp, rs, err := f.h.Lazy.RestoreLazy(ctx, id, spec, cp, out)
	if err != nil {
		return nil, rs, nil, err
	}
	_, release, err := lp.HoldUffds()
	if err != nil {
		// Without the copies, a lazy-pages that died would leave the
		// unit reading zeros: the resume is refused, the unit killed
		// before the process that serves its pages.
		derr := sb.Destroy(context.WithoutCancel(ctx))
		lp.Kill()
		return nil, rs, nil, errors.Join(fmt.Errorf("%w: holding the unit's userfaultfds: %w", executor.ErrRestore, err), derr)
	}
	p := &pages{start: r.start, done: make(chan struct{})}
	go p.watch(sb, lp, release, cp.Deadline, f.h.Log)
	return sb, rs, p, nil
}

// freezeWait bounds the freeze of a unit whose pages were lost.
const freezeWait = 30 * time.Second

// errFreezeArmed is the freeze's failure where the lazy.freeze fault is
// armed (failpoint.Fails).
var errFreezeArmed = errors.New("unable to freeze (failpoint lazy.freeze)")

// watch waits for lp to bring every page in, within deadline. Then
// it releases the held userfaultfds. When lp fails, or the deadline
// passes, it freezes the unit (a thread waiting on a page that never
// comes may not freeze; where the freeze fails the unit is killed
// first, for the processes it forked since the restore), ends lp, and
// says the pages were lost; the copies stay held until the unit is gone
// (the daemon destroys it), so no thread ever reads a page that did not
// come as zeros. A unit gone first (closed, or exited) needs no more
// pages: lp is ended, and nothing is said.
func (p *pages) watch(sb Sandbox, lp Pages, release func(), deadline time.Duration, log *slog.Logger) {
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	wctx, stop := context.WithCancel(context.Background())
	defer stop()
	// gone closes when the unit has exited; not when the wait ends
	// otherwise (the daemon stopping closes the executor's client: the
	// unit goes on, and lazy-pages must serve it).
	gone := make(chan struct{})
	go func() {
		if _, err := sb.Wait(wctx); err == nil {
			close(gone)
		}
	}()
	var lost error
	select {
	case <-lp.Done():
		_, lost = lp.Result()
	case <-timer.C:
		lost = fmt.Errorf("%w: %w: not every page was resident %s after the restore", pageserver.ErrPagesLost, executor.ErrRestoreTimeout, deadline)
	case <-gone:
		lp.Kill()
		release()
		p.finish(time.Now(), nil, false)
		return
	}
	if lost == nil {
		release()
		p.finish(lp.ExitedAt(), nil, true)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), freezeWait)
	defer cancel()
	perr := errFreezeArmed
	if !failpoint.Fails("lazy.freeze") {
		perr = sb.Pause(ctx)
	}
	var kerr error
	if perr != nil {
		// A thread the freeze did not stop may be a process forked
		// after the restore, whose userfaultfd the daemon may not hold
		// yet (it copies a fork's within a few milliseconds): the unit
		// dies before lazy-pages does, so that it reads no zero page.
		// Its sandbox stays, with the records that say its lazy restore
		// is unfinished, until the daemon has parked the run back: a
		// daemon that dies first leaves them to the next start.
		kerr = sb.Kill(context.WithoutCancel(ctx))
	}
	lp.Kill()
	failpoint.Fire("lazy.lost")
	if log != nil {
		log.Warn("lazy restore: pages lost", "run", sb.ID(), "err", lost, "freeze", perr, "kill", kerr)
	}
	p.finish(time.Now(), lost, true)
	<-gone
	release()
}
