package warmpool

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/idle"
)

// fakeWarm is a warm sandbox in memory.
type fakeWarm struct {
	mu        sync.Mutex
	discarded int
}

func (f *fakeWarm) Resident(context.Context) (uint64, error) { return 8 << 20, nil }
func (f *fakeWarm) Discard(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.discarded++
	return nil
}
func (f *fakeWarm) gone() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.discarded
}

func newPool(t *testing.T, max int) *Pool {
	t.Helper()
	m, err := idle.NewMeter(idle.Config{SysfsRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	// A sweep an hour apart: the tests sweep by hand.
	p := New(Config{Max: max, MaxAge: time.Minute, Sweep: time.Hour, Meter: m})
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// ready makes a warm sandbox for run at once.
func ready(t *testing.T, p *Pool, run string, keep func() bool) *fakeWarm {
	t.Helper()
	w := &fakeWarm{}
	if !p.Prepare(run, func(context.Context) (Entry, error) { return w, nil }, keep) {
		t.Fatalf("prepare %s refused", run)
	}
	waitReady(t, p, run)
	return w
}

func waitReady(t *testing.T, p *Pool, run string) {
	t.Helper()
	p.mu.Lock()
	s := p.entries[run]
	p.mu.Unlock()
	if s != nil {
		<-s.ready
	}
}

func TestTakeHandsTheSandboxWithItsResidency(t *testing.T) {
	p := newPool(t, 2)
	w := ready(t, p, "r1", nil)
	if st := p.Stats(); st.Ready != 1 || st.Made != 1 || st.Max != 2 {
		t.Fatalf("stats %+v", st)
	}
	e, res := p.Take("r1")
	if e != w || res.Sandboxes != 1 || res.Bytes != 8<<20 || res.Estimated != 1 {
		t.Fatalf("take: %v %+v", e, res)
	}
	if e, res := p.Take("r1"); e != nil || res.Sandboxes != 0 {
		t.Fatalf("second take: %v %+v", e, res)
	}
	if st := p.Stats(); st.Used != 1 || st.Missed != 1 || st.Ready != 0 {
		t.Fatalf("stats %+v", st)
	}
	if w.gone() != 0 {
		t.Fatal("a taken sandbox was discarded by the pool")
	}
}

func TestDisabledAndFullPoolsRefuse(t *testing.T) {
	var nilPool *Pool
	if nilPool.Prepare("r", nil, nil) || nilPool.Enabled() {
		t.Fatal("a nil pool prepared")
	}
	if e, _ := nilPool.Take("r"); e != nil {
		t.Fatal("a nil pool handed a sandbox")
	}
	off := newPool(t, 0)
	if off.Prepare("r", func(context.Context) (Entry, error) { return &fakeWarm{}, nil }, nil) {
		t.Fatal("a pool of 0 prepared")
	}
	p := newPool(t, 1)
	ready(t, p, "a", nil)
	if p.Prepare("b", func(context.Context) (Entry, error) { return &fakeWarm{}, nil }, nil) {
		t.Fatal("a full pool prepared")
	}
	if st := p.Stats(); st.Refused != 1 || st.Ready != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestExpiredIsDiscardedAndItsResidencyOwed(t *testing.T) {
	p := newPool(t, 2)
	w := ready(t, p, "r1", nil)
	p.sweep(time.Now()) // young: kept
	if w.gone() != 0 {
		t.Fatal("a young sandbox was discarded")
	}
	p.sweep(time.Now().Add(2 * time.Minute))
	if w.gone() != 1 {
		t.Fatal("an expired sandbox was kept")
	}
	e, res := p.Take("r1")
	if e != nil || res.Sandboxes != 1 {
		t.Fatalf("take after expiry: %v %+v", e, res)
	}
	if st := p.Stats(); st.Expired != 1 || st.Missed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRunNoLongerHereIsDiscardedOwingNothing(t *testing.T) {
	p := newPool(t, 2)
	var mu sync.Mutex
	here := true
	keep := func() bool { mu.Lock(); defer mu.Unlock(); return here }
	w := ready(t, p, "r1", keep)
	p.sweep(time.Now())
	if w.gone() != 0 {
		t.Fatal("discarded while the run waits here")
	}
	mu.Lock()
	here = false
	mu.Unlock()
	p.sweep(time.Now())
	if w.gone() != 1 {
		t.Fatal("kept for a run that left")
	}
	if e, res := p.Take("r1"); e != nil || res.Sandboxes != 0 {
		t.Fatalf("take: %v %+v", e, res)
	}
}

// A resume or a close that comes while the sandbox is being made waits for
// it: a resume takes it, a close discards it.
func TestTakeAndDiscardWaitForTheMaking(t *testing.T) {
	p := newPool(t, 2)
	for _, take := range []bool{true, false} {
		release := make(chan struct{})
		w := &fakeWarm{}
		p.Prepare("r", func(context.Context) (Entry, error) { <-release; return w, nil }, nil)
		done := make(chan Entry)
		go func() {
			if take {
				e, _ := p.Take("r")
				done <- e
				return
			}
			p.Discard(context.Background(), "r", true)
			done <- nil
		}()
		close(release)
		e := <-done
		if take && (e != w || w.gone() != 0) {
			t.Fatalf("take while making: %v, discarded %d", e, w.gone())
		}
		if !take && w.gone() != 1 {
			t.Fatal("discard while making left the sandbox")
		}
	}
}

func TestFailedMakingLeavesNothing(t *testing.T) {
	p := newPool(t, 2)
	p.Prepare("r", func(context.Context) (Entry, error) { return nil, errors.New("no") }, nil)
	waitReady(t, p, "r")
	if e, _ := p.Take("r"); e != nil {
		t.Fatal("a failed making handed a sandbox")
	}
	if st := p.Stats(); st.Failed != 1 || st.Ready+st.Preparing != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCloseDiscardsEverything(t *testing.T) {
	p := newPool(t, 3)
	a, b := ready(t, p, "a", nil), ready(t, p, "b", nil)
	p.Close(context.Background())
	if a.gone() != 1 || b.gone() != 1 {
		t.Fatal("close left warm sandboxes")
	}
	if p.Prepare("c", func(context.Context) (Entry, error) { return &fakeWarm{}, nil }, nil) {
		t.Fatal("a closed pool prepared")
	}
}

// A sandbox the pool still holds for a run is discarded before its next
// one is made (the two would share the run's channel directory).
func TestPrepareReplaces(t *testing.T) {
	p := newPool(t, 2)
	old := ready(t, p, "r", nil)
	next := ready(t, p, "r", nil)
	if old.gone() != 1 || next.gone() != 0 {
		t.Fatalf("old discarded %d, next %d", old.gone(), next.gone())
	}
}

func TestRemoveLeftoversKeepsExecutingAndUnread(t *testing.T) {
	dir := t.TempDir()
	for _, run := range []string{"parked", "active", "unread", "gone"} {
		if err := os.MkdirAll(filepath.Join(dir, run), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, run, "transcript"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	RemoveLeftovers(dir, func(run string) (bool, error) {
		switch run {
		case "active":
			return true, nil
		case "unread":
			return false, errors.New("cannot read")
		}
		return false, nil
	}, slog.Default())
	for run, want := range map[string]bool{"parked": false, "active": true, "unread": true, "gone": false} {
		if _, err := os.Stat(filepath.Join(dir, run)); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", run, err == nil, want)
		}
	}
	RemoveLeftovers(filepath.Join(dir, "none"), nil, slog.Default()) // no directory: nothing to do
}
