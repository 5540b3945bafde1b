package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/imageparks"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// fakePages is a lazy restore's `criu lazy-pages` in memory: the test
// says when it ends, and with what.
type fakePages struct {
	done     chan struct{}
	mu       sync.Mutex
	err      error
	at       time.Time
	killed   bool
	released bool
}

func (p *fakePages) Done() <-chan struct{} { return p.done }
func (p *fakePages) ExitedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.at
}
func (p *fakePages) Result() (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Millisecond, p.err
}
func (p *fakePages) Kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
}
func (p *fakePages) HoldUffds() (int, func(), error) {
	return 1, func() {
		p.mu.Lock()
		p.released = true
		p.mu.Unlock()
	}, nil
}

// end ends the lazy-pages with err (nil: every page came).
func (p *fakePages) end(err error) {
	p.mu.Lock()
	p.err, p.at = err, time.Now()
	p.mu.Unlock()
	close(p.done)
}

// RestoreLazy is the fake executor's lazy restore: a Restore whose pages
// are sent on x.pages, for the test to end.
func (x *fakeExec) RestoreLazy(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (forms.Sandbox, forms.Pages, executor.RestoreStats, error) {
	sb, st, err := x.Restore(ctx, id, spec, cp, out)
	if err != nil {
		return nil, nil, st, err
	}
	p := &fakePages{done: make(chan struct{})}
	x.pages <- p
	return sb, p, st, nil
}

// errorsTo is a logger that passes every record on to next and sends the
// error-level ones' errors on errs.
type errorsTo struct {
	slog.Handler
	errs chan error
}

func (h errorsTo) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		var err error = errors.New(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			if e, ok := a.Value.Any().(error); ok && a.Key == "err" {
				err = fmt.Errorf("%s: %w", r.Message, e)
			}
			return true
		})
		h.errs <- err
	}
	return h.Handler.Handle(ctx, r)
}

// lazyHost is a fake host whose image resumes are lazy, with run r
// parked and resumed: it returns the resume's pages and the snapshot it
// resumed from, and a channel of the errors the daemon logs.
func lazyHost(t *testing.T) (*fakeHost, *fakePages, string, chan error) {
	errs := make(chan error, 4)
	h := newFakeHost(t, func(d *Daemon) {
		d.cfg.LazyResume = true
		d.log = slog.New(errorsTo{d.log.Handler(), errs})
	})
	pages := make(chan *fakePages, 1)
	h.ex.pages = pages
	h.start(t, "r")
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	st, _ := h.d.st.Run("r")
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	return h, <-pages, st.Parked.String(), errs
}

// Pages lost after a lazy resume: the unit, frozen, ends its interval in
// a park back at the snapshot it resumed from; the run is parked, and
// resumes again.
func TestLazyPagesLostParksBack(t *testing.T) {
	h, p, snap, errs := lazyHost(t)
	events, cancel := h.d.events.Subscribe()
	defer cancel()
	p.end(fmt.Errorf("%w: lazy-pages killed", pageserver.ErrPagesLost))
	for e := range events {
		if e.Kind == "run.pages-lost" {
			break
		}
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if got := h.kinds(t, "r"); got != "executed suspended resumed executed suspended" {
		t.Fatalf("segments %s", got)
	}
	st, _ := h.d.st.Run("r")
	if st.Phase != record.PhaseParked || st.Parked.String() != snap {
		t.Fatalf("phase %s at %v, want parked at %s", st.Phase, st.Parked, snap)
	}
	h.teardown(t, "r")
	if h.ex.sandbox("r") != nil || !p.killed {
		t.Fatal("the unit or its lazy-pages outlived the park back")
	}
	h.d.cfg.LazyResume = false
	h.d.wire()
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}

// Pages lost, and the unit's freeze fails (a thread waiting on a page
// that never comes): the form destroys the unit before it ends
// lazy-pages. That exit is not the unit's own: the run is not closed, but
// parked back at the snapshot it resumed from.
func TestLazyPagesLostFreezeFails(t *testing.T) {
	h, p, snap, errs := lazyHost(t)
	h.ex.mu.Lock()
	h.ex.pauseErr = errors.New("unable to freeze")
	h.ex.mu.Unlock()
	events, cancel := h.d.events.Subscribe()
	defer cancel()
	p.end(fmt.Errorf("%w: lazy-pages killed", pageserver.ErrPagesLost))
	for e := range events {
		if e.Kind == "run.pages-lost" || e.Kind == "run.closed" {
			break
		}
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	st, _ := h.d.st.Run("r")
	if got := h.kinds(t, "r"); got != "executed suspended resumed executed suspended" || st.Phase != record.PhaseParked || st.Parked.String() != snap {
		t.Fatalf("segments %s, phase %s at %v; want parked back at %s", got, st.Phase, st.Parked, snap)
	}
	h.teardown(t, "r")
}

// Pages lost, and the park back refused at its append (another writer
// closed the run): the record stays as the other writer left it, and the
// unit stays frozen in a new interval (a close ends it), its
// userfaultfds held — no thread
// reads a page that never came.
func TestLazyPagesLostRefusedAtAppend(t *testing.T) {
	h, p, _, errs := lazyHost(t)
	head, _ := h.d.st.Head("r")
	if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
		t.Fatal(err)
	}
	p.end(fmt.Errorf("%w: lazy-pages killed", pageserver.ErrPagesLost))
	if err := <-errs; !errors.Is(err, record.ErrClosed) {
		t.Fatalf("logged %v, want the record's refusal", err)
	}
	if got := h.kinds(t, "r"); got != "executed suspended resumed closed" {
		t.Fatalf("segments %s, want the other writer's last", got)
	}
	sb := h.ex.sandbox("r")
	if sb == nil {
		t.Fatal("the unit was destroyed after the refused append")
	}
	if s, _ := sb.Status(t.Context()); s != "paused" {
		t.Fatalf("unit %s, want frozen", s)
	}
	p.mu.Lock()
	released := p.released
	p.mu.Unlock()
	if released {
		t.Fatal("the userfaultfds were released while the unit lives")
	}
	lv := h.d.runs.peek("r").live
	if lv == nil || lv.iv.Ended() || !hasEvent(lv.iv.Events(), attest.EventParkRefused) {
		t.Fatal("no new interval after the refused append")
	}
	forms.RemoveRun(t.Context(), h.d.ex, "r", h.d.log)
}

// A resume admitted while the restores are crowded (every slot held or
// awaited) restores eagerly: no lazy-pages, and its restore says so. Once
// they are not, the next resume is lazy again.
func TestLazyCrowdedRestoresEagerly(t *testing.T) {
	h, p, _, _ := lazyHost(t)
	p.end(nil) // every page in
	park := func() {
		if _, err := h.d.Park(t.Context(), "r"); err != nil {
			t.Fatal(err)
		}
		h.teardown(t, "r")
	}
	park()
	var releases []func()
	for range imageparks.Slots() {
		release, err := h.d.forms.Gate.Admit(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	type result struct {
		res answers.Resumed
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := h.d.Resume(t.Context(), "r", nil)
		done <- result{res, err}
	}()
	time.Sleep(100 * time.Millisecond) // admitted, and waiting for a slot
	for _, release := range releases {
		release()
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Restore == nil || r.res.Restore.Lazy {
		t.Fatalf("a resume admitted with every slot held restored %+v, want eagerly", r.res.Restore)
	}
	select {
	case <-h.ex.pages:
		t.Fatal("a crowded resume started lazy-pages")
	default:
	}
	park()
	res, err := h.d.Resume(t.Context(), "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Restore == nil || !res.Restore.Lazy {
		t.Fatalf("a resume with the slots free restored %+v, want lazily", res.Restore)
	}
	(<-h.ex.pages).end(nil)
	// Neither resume is still expected to ask for a slot.
	for range imageparks.Slots() - 1 {
		_, done := h.d.forms.Gate.Expect()
		defer done()
	}
	if crowded, done := h.d.forms.Gate.Expect(); crowded {
		t.Fatal("the resumes' expectations outlived them")
	} else {
		done()
	}
}
