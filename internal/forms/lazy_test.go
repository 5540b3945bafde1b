package forms

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// fakeLazy is a lazy restore over the fake box: the restore is the box's,
// its pages come when the test says (fakePages), and it notes the order
// of what happens to the unit and to the process that serves its pages.
type fakeLazy struct {
	box     *fakeBox
	pages   *fakePages
	holdErr error

	mu    sync.Mutex
	order []string
}

func (l *fakeLazy) note(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.order = append(l.order, s)
}

func (l *fakeLazy) notes() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order)
}

func (l *fakeLazy) RestoreLazy(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (Sandbox, Pages, executor.RestoreStats, error) {
	sb, st, err := l.box.Restore(ctx, id, spec, cp, out)
	if err != nil {
		return nil, nil, st, err
	}
	return &lazyUnit{fakeUnit: sb.(*fakeUnit), l: l, gone: make(chan struct{})}, l.pages, st, nil
}

// lazyUnit is a fake unit whose Wait returns once it is destroyed.
type lazyUnit struct {
	*fakeUnit
	l    *fakeLazy
	once sync.Once
	gone chan struct{}
}

func (u *lazyUnit) Destroy(ctx context.Context) error {
	u.l.note("destroy")
	u.once.Do(func() { close(u.gone) })
	return u.fakeUnit.Destroy(ctx)
}

func (u *lazyUnit) Kill(ctx context.Context) error {
	u.l.note("kill unit")
	u.once.Do(func() { close(u.gone) })
	return u.fakeUnit.Kill(ctx)
}

func (u *lazyUnit) Pause(ctx context.Context) error {
	u.l.note("freeze")
	return u.fakeUnit.Pause(ctx)
}

func (u *lazyUnit) Wait(ctx context.Context) (uint32, error) {
	select {
	case <-u.gone:
		return 137, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// fakePages is a lazy-pages process that exits when told (exit) or
// killed, and holds two userfaultfds.
type fakePages struct {
	l        *fakeLazy
	once     sync.Once
	done     chan struct{}
	err      error
	at       time.Time
	released chan struct{}
}

func newFakeLazy(box *fakeBox) *fakeLazy {
	l := &fakeLazy{box: box}
	l.pages = &fakePages{l: l, done: make(chan struct{}), released: make(chan struct{})}
	return l
}

func (p *fakePages) exit(err error) {
	p.once.Do(func() {
		p.err, p.at = err, time.Now()
		close(p.done)
	})
}

func (p *fakePages) Done() <-chan struct{}          { return p.done }
func (p *fakePages) Result() (time.Duration, error) { return 0, p.err }
func (p *fakePages) ExitedAt() time.Time            { return p.at }

func (p *fakePages) Kill() {
	p.l.note("kill lazy-pages")
	p.exit(fmt.Errorf("%w: criu lazy-pages: signal: killed", pageserver.ErrPagesLost))
}

func (p *fakePages) HoldUffds() (int, func(), error) {
	if p.l.holdErr != nil {
		return 0, nil, p.l.holdErr
	}
	return 2, func() {
		p.l.note("release")
		close(p.released)
	}, nil
}

// noMeter meters nothing: the interval's receipt is an estimate.
type noMeter struct{}

func (noMeter) CgroupOf(int) (string, error) { return "", errors.New("no meter here") }
func (noMeter) Begin(string) (interval.Metering, error) {
	return nil, errors.New("no meter here")
}
func (noMeter) Reattach(string, time.Time, uint64) (interval.Metering, error) {
	return nil, errors.New("no meter here")
}

// lazyWoken parks run r on a host that resumes lazily and wakes it.
func lazyWoken(t *testing.T, deadline time.Duration) (Env, *fakeLazy, Woken) {
	t.Helper()
	h, box := testHost(t, nil)
	l := newFakeLazy(box)
	h.Lazy, h.CRIUDeadline = l, deadline
	f := h.For(unit.ImageMode)
	w, err := f.Start(t.Context(), stored(t, h, imageRun("r")))
	if err != nil {
		t.Fatal(err)
	}
	taken, err := f.Snapshot(t.Context(), w.Unit)
	if err != nil {
		t.Fatal(err)
	}
	woke, err := f.Wake(t.Context(), imageRun("r"), Waking{Snapshot: taken.Snapshot, Retained: taken.Retained, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	return h, l, woke
}

func openInterval(h Env, u *Unit) *interval.Interval {
	ih := interval.Recorder{StateDir: h.StateDir, Meter: noMeter{}}
	return ih.Begin(u.ID, u.Sandbox, unit.Limits{}, attest.EventRestored, ih.MarkNow(u.ID))
}

func journaled(iv *interval.Interval, event string) int {
	n := 0
	for _, e := range iv.Events() {
		if strings.HasPrefix(string(e.Data), event+" ") {
			n++
		}
	}
	return n
}

// A lazy resume runs the unit before its pages are in; its restore says
// lazy. A park waits for every page: asked before then, it stops at its
// context and takes no checkpoint. Once lazy-pages exits cleanly the
// held userfaultfds are released, the journal gets one resident entry,
// and the park goes through.
func TestLazyParkWaitsForEveryPage(t *testing.T) {
	h, l, w := lazyWoken(t, time.Hour)
	if w.Restored == nil || !w.Restored.Lazy || w.Unit.PagesDone() == nil {
		t.Fatalf("a lazy wake: restored %+v, pages %v", w.Restored, w.Unit.PagesDone())
	}
	f := h.For(unit.ImageMode)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	checkpoints := l.box.n
	if _, err := f.Snapshot(ctx, w.Unit); !errors.Is(err, context.Canceled) || l.box.n != checkpoints {
		t.Fatalf("a park before every page is in: %v, %d checkpoints (had %d)", err, l.box.n, checkpoints)
	}
	iv := openInterval(h, w.Unit)
	if err := w.Unit.JournalPages(iv); err != nil || journaled(iv, "resident") != 0 {
		t.Fatalf("pages still arriving: %v, journal %d resident entries", err, journaled(iv, "resident"))
	}
	l.pages.exit(nil)
	<-w.Unit.PagesDone()
	if got := l.notes(); !slices.Equal(got, []string{"release"}) {
		t.Fatalf("every page in: %q, want the copies released and nothing else", got)
	}
	w.Unit.Spool(iv)
	if err := w.Unit.JournalPages(iv); err != nil || journaled(iv, "resident") != 1 {
		t.Fatalf("every page in: %v, journal %d resident entries, want 1", err, journaled(iv, "resident"))
	}
	if _, err := f.Snapshot(t.Context(), w.Unit); err != nil || l.box.n != checkpoints+1 {
		t.Fatalf("a park once every page is in: %v", err)
	}
}

// A served lazy resume says so in its restored entry; a lazy one whose
// every byte was rehashed first does not.
func TestLazyServedJournaled(t *testing.T) {
	_, _, w := lazyWoken(t, time.Hour)
	if w.Restored == nil || w.Restored.Served {
		t.Fatalf("a lazy resume, not served: restored %+v", w.Restored)
	}
	h, box := testHost(t, nil)
	h.Lazy, h.LazyServed, h.CRIUDeadline = newFakeLazy(box), true, time.Hour
	f := h.For(unit.ImageMode)
	sw, err := f.Start(t.Context(), stored(t, h, imageRun("r")))
	if err != nil {
		t.Fatal(err)
	}
	taken, err := f.Snapshot(t.Context(), sw.Unit)
	if err != nil {
		t.Fatal(err)
	}
	woke, err := f.Wake(t.Context(), imageRun("r"), Waking{Snapshot: taken.Snapshot, Retained: taken.Retained, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	if woke.Restored == nil || !woke.Restored.Lazy || !woke.Restored.Served {
		t.Fatalf("a served lazy resume: restored %+v", woke.Restored)
	}
}

// lazy-pages dying mid-way: the unit is frozen before anything else, the
// loss is a typed error a park is refused with (no checkpoint of a unit
// with holes), the journal gets one pages-lost entry, and the held
// userfaultfds are released only once the unit is gone.
func TestLazyPagesLost(t *testing.T) {
	h, l, w := lazyWoken(t, time.Hour)
	l.pages.exit(fmt.Errorf("%w: criu lazy-pages: exit status 1", pageserver.ErrPagesLost))
	<-w.Unit.PagesDone()
	if got := l.notes(); !slices.Equal(got, []string{"freeze", "kill lazy-pages"}) {
		t.Fatalf("after the loss: %q, want the unit frozen, then lazy-pages ended, the copies held", got)
	}
	if s := status(t, w.Unit.Sandbox); s != "paused" {
		t.Fatalf("the unit is %s after its pages were lost, want frozen", s)
	}
	checkpoints := l.box.n
	if _, err := h.For(unit.ImageMode).Snapshot(t.Context(), w.Unit); !errors.Is(err, pageserver.ErrPagesLost) || l.box.n != checkpoints {
		t.Fatalf("a park after the loss: %v, %d checkpoints (had %d)", err, l.box.n, checkpoints)
	}
	iv := openInterval(h, w.Unit)
	for range 2 {
		if err := w.Unit.JournalPages(iv); !errors.Is(err, pageserver.ErrPagesLost) {
			t.Fatalf("JournalPages after the loss: %v", err)
		}
	}
	if n := journaled(iv, "pages-lost"); n != 1 {
		t.Fatalf("journal: %d pages-lost entries, want 1", n)
	}
	var lost attest.PagesLost
	if !(&attest.Journal{Entries: iv.Events()}).Find(&lost) || !strings.Contains(lost.Reason, "exit status 1") {
		t.Fatalf("pages-lost entry %+v", lost)
	}
	if err := w.Unit.Sandbox.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	<-l.pages.released
	if got := l.notes(); !slices.Equal(got, []string{"freeze", "kill lazy-pages", "destroy", "release"}) {
		t.Fatalf("order %q: the copies must outlive the unit", got)
	}
}

// A unit whose freeze fails after its pages were lost (a thread waiting
// on a missing page) may hold a process forked after the restore, whose
// userfaultfd only lazy-pages holds: the unit is destroyed before
// lazy-pages is ended, so that child never reads a zero page; the copies
// are released after both. Its sandbox stays, for the daemon to destroy
// once the run is parked back (a crash before that leaves the records of
// the unfinished lazy restore to the next start). PagesLost says so to
// the exit watcher.
func TestLazyPagesLostFreezeFails(t *testing.T) {
	_, l, w := lazyWoken(t, time.Hour)
	l.box.pauseErr = errors.New("unable to freeze")
	l.pages.exit(fmt.Errorf("%w: criu lazy-pages: signal: killed", pageserver.ErrPagesLost))
	<-w.Unit.PagesDone()
	select {
	case <-l.pages.released:
	case <-time.After(10 * time.Second):
		t.Fatalf("the copies still held 10 s after the loss: %q", l.notes())
	}
	if got := l.notes(); !slices.Equal(got, []string{"freeze", "kill unit", "kill lazy-pages", "release"}) {
		t.Fatalf("order %q: the unit must die before lazy-pages, its sandbox kept", got)
	}
	if !w.Unit.PagesLost() {
		t.Fatal("PagesLost: false")
	}
}

// Pages not all in within the deadline are lost: lazy-pages is ended, and
// the error says both.
func TestLazyPagesDeadline(t *testing.T) {
	h, l, w := lazyWoken(t, time.Nanosecond)
	<-w.Unit.PagesDone()
	_, err := h.For(unit.ImageMode).Snapshot(t.Context(), w.Unit)
	if !errors.Is(err, pageserver.ErrPagesLost) || !errors.Is(err, executor.ErrRestoreTimeout) {
		t.Fatalf("a park after the deadline: %v", err)
	}
	if got := l.notes(); !slices.Equal(got, []string{"freeze", "kill lazy-pages"}) {
		t.Fatalf("after the deadline: %q", got)
	}
	if err := w.Unit.Sandbox.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	<-l.pages.released
}

// Without a copy of the userfaultfds a dying lazy-pages would zero the
// unit's memory: the resume is refused, the unit destroyed before
// lazy-pages is ended, and the error is a restore's.
func TestLazyHoldRefused(t *testing.T) {
	h, box := testHost(t, nil)
	l := newFakeLazy(box)
	l.holdErr = errors.New("pidfd_getfd: operation not permitted")
	h.Lazy = l
	f := h.For(unit.ImageMode)
	w, err := f.Start(t.Context(), stored(t, h, imageRun("r")))
	if err != nil {
		t.Fatal(err)
	}
	taken, err := f.Snapshot(t.Context(), w.Unit)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Wake(t.Context(), imageRun("r"), Waking{Snapshot: taken.Snapshot, Retained: taken.Retained, Lazy: true})
	if !errors.Is(err, executor.ErrRestore) {
		t.Fatalf("wake without the copies: %v", err)
	}
	if got := l.notes(); !slices.Equal(got, []string{"destroy", "kill lazy-pages"}) {
		t.Fatalf("order %q", got)
	}
}

// Lazy resume is off unless asked for, and only an executor that can
// restore lazily is used for it.
func TestLazyOf(t *testing.T) {
	var c *executor.Client
	if LazyOf(c, false) != nil || LazyOf(c, true) == nil {
		t.Fatal("LazyOf(executor) off or on")
	}
	if LazyOf(&fakeBox{}, true) != nil {
		t.Fatal("a box without a lazy restore restores lazily")
	}
	h, _ := testHost(t, nil)
	if h.Lazy != nil {
		t.Fatal("a host resumes lazily by default")
	}
}

// A unit gone while its pages arrive (closed, or exited) needs no more:
// lazy-pages is ended, the copies released, and the journal says nothing
// of its pages.
func TestLazyUnitGone(t *testing.T) {
	h, l, w := lazyWoken(t, time.Hour)
	if err := w.Unit.Sandbox.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	<-w.Unit.PagesDone()
	<-l.pages.released
	if got := l.notes(); !slices.Equal(got, []string{"destroy", "kill lazy-pages", "release"}) {
		t.Fatalf("order %q", got)
	}
	iv := openInterval(h, w.Unit)
	if err := w.Unit.JournalPages(iv); err != nil || journaled(iv, "resident")+journaled(iv, "pages-lost") != 0 {
		t.Fatalf("a unit gone first: %v, journal %d entries", err, len(iv.Events()))
	}
}

// restoringBox is the fake box with a lazy-pages an earlier daemon
// process started still running for the sandboxes in restoring, and a
// lazy restore not seen to finish for those in unfinished.
type restoringBox struct {
	*fakeBox
	restoring, unfinished map[string]bool
}

func (b restoringBox) LazyRestoring(id string) bool       { return b.restoring[id] }
func (b restoringBox) LazyUnfinished(id string) bool      { return b.unfinished[id] }
func (restoringBox) LazySettled(string) (time.Time, bool) { return time.Time{}, false }

// A unit restored lazily by an earlier daemon process, whose lazy-pages
// still runs, is not parked (ErrPagesArriving): nothing here can wait
// for its pages, and a dump now would leave them out. Once lazy-pages is
// gone without a daemon seeing every page in, its pages are lost
// (ErrPagesLost: it may have read zeros). Seen to finish, it parks.
func TestLazyPagesArrivingRefused(t *testing.T) {
	h, box := testHost(t, nil)
	rb := restoringBox{box, map[string]bool{"r": true}, map[string]bool{"r": true}}
	h.Sandboxes = rb
	f := h.For(unit.ImageMode)
	w, err := f.Start(t.Context(), stored(t, h, imageRun("r")))
	if err != nil {
		t.Fatal(err)
	}
	found := Orphan(w.Unit.Run, w.Unit.Sandbox)
	if !h.LazyUnfinished(found) {
		t.Fatal("LazyUnfinished: false")
	}
	if _, err := f.Snapshot(t.Context(), found); !errors.Is(err, pageserver.ErrPagesArriving) || box.n != 0 {
		t.Fatalf("a park while another process's lazy-pages runs: %v, %d checkpoints", err, box.n)
	}
	rb.restoring["r"] = false
	if _, err := f.Snapshot(t.Context(), found); !errors.Is(err, pageserver.ErrPagesLost) || box.n != 0 {
		t.Fatalf("a park once it is gone, unseen: %v, %d checkpoints", err, box.n)
	}
	rb.unfinished["r"] = false
	if _, err := f.Snapshot(t.Context(), found); err != nil || box.n != 1 {
		t.Fatalf("a park once it is seen finished: %v, %d checkpoints", err, box.n)
	}
}
