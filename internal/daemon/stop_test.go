package daemon

import (
	"errors"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The stop parks every executing run and lists it; from then on no run
// starts or resumes. The next start resumes each listed run still parked
// at the head its park left, and leaves alone one that moved on (parked
// again by hand) and one closed since; a run parked by hand before the
// stop stays parked.
func TestStopParksStartResumes(t *testing.T) {
	h := newFakeHost(t)
	for _, id := range []string{"a", "b", "moved", "closed", "byhand"} {
		h.start(t, id)
	}
	if _, err := h.d.Park(t.Context(), "byhand"); err != nil {
		t.Fatal(err)
	}
	runs, err := h.d.ParkForStop(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	parked := map[string]bool{}
	for _, e := range runs {
		if e.Err != nil || e.Answer == nil || e.Answer.Run.Status != answers.ParkedImage {
			t.Fatalf("%s: %+v", e.Run, e)
		}
		parked[e.Run] = true
	}
	if len(parked) != 4 || parked["byhand"] {
		t.Fatalf("the stop parked %v, want a, b, moved and closed", parked)
	}
	if _, err := h.d.Start(t.Context(), "new", unit.Spec{Image: fakeImage, Args: []string{"/unit"}}, unit.Grants{}); !errors.Is(err, answers.ErrStopping) {
		t.Fatalf("a start while stopping: %v, want answers.ErrStopping", err)
	}
	if _, err := h.d.Resume(t.Context(), "a", nil); !errors.Is(err, answers.ErrStopping) {
		t.Fatalf("a resume while stopping: %v, want answers.ErrStopping", err)
	}
	for _, id := range []string{"a", "b", "moved", "closed", "byhand"} {
		h.teardown(t, id)
	}

	// The restart, on the same state directory.
	h.d.stopping.Store(false)
	if _, err := h.d.Resume(t.Context(), "moved", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Park(t.Context(), "moved"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "moved")
	if _, err := h.d.Close(t.Context(), "closed", ""); err != nil {
		t.Fatal(err)
	}
	back := h.d.ComeBack(t.Context(), 2)
	resumed := map[string]bool{}
	for _, e := range back {
		if e.Err != nil || e.Answer == nil {
			t.Fatalf("%s: %+v", e.Run, e)
		}
		resumed[e.Run] = true
	}
	if len(resumed) != 2 || !resumed["a"] || !resumed["b"] {
		t.Fatalf("the start resumed %v, want a and b", resumed)
	}
	for id, want := range map[string]answers.Status{"a": answers.Running, "b": answers.Running, "moved": answers.ParkedImage,
		"closed": answers.Closed, "byhand": answers.ParkedImage} {
		if r, err := h.d.Run(id); err != nil || r.Status != want {
			t.Errorf("%s: %s (%v), want %s", id, r.Status, err, want)
		}
	}
	if es, err := openComeback(h.d.cfg.StateDir).Entries(); err != nil || len(es) != 0 {
		t.Fatalf("after the start the list holds %v, %v", es, err)
	}
	for _, id := range []string{"a", "b", "moved", "byhand"} {
		if _, err := h.d.Close(t.Context(), id, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// A run the stop could not park goes on executing, is reported, and is
// not listed; a listed run whose resume is refused at start stays parked
// and listed for the next start.
func TestStopParkRefused(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	h.ex.checkpointErr = executor.ErrCheckpoint
	runs, err := h.d.ParkForStop(t.Context(), 0)
	if err != nil || len(runs) != 1 || runs[0].Answer != nil || !errors.Is(runs[0].Err, executor.ErrCheckpoint) {
		t.Fatalf("the stop's parks %+v, %v; want r refused by its checkpoint", runs, err)
	}
	if r, err := h.d.Run("r"); err != nil || r.Status != answers.Running {
		t.Fatalf("r: %s, %v; want it running", r.Status, err)
	}
	if es, _ := openComeback(h.d.cfg.StateDir).Entries(); len(es) != 0 {
		t.Fatalf("listed %v", es)
	}

	h.ex.checkpointErr = nil
	h.d.stopping.Store(false)
	if _, err := h.d.ParkAll(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	h.ex.restoreErr = executor.ErrRestore
	if back := h.d.ComeBack(t.Context(), 0); len(back) != 1 || !errors.Is(back[0].Err, executor.ErrRestore) {
		t.Fatalf("the start's resumes %+v; want r refused by its restore", back)
	}
	if es, _ := openComeback(h.d.cfg.StateDir).Entries(); len(es) != 1 || es[0].Run != "r" {
		t.Fatalf("after a refused resume the list holds %v, want r", es)
	}
	h.ex.restoreErr = nil
	if back := h.d.ComeBack(t.Context(), 0); len(back) != 1 || back[0].Err != nil {
		t.Fatalf("the next start's resumes %+v", back)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}

// In a fleet the start resumes only the listed runs the directory still
// says are this host's: one another host claimed while this one was down
// is left parked here, its entry dropped, the directory as it was.
func TestFleetComeBackOnlyOwnRuns(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/comeback/", 5*time.Second)
	a, b := joinFleet(t, dir, "a"), joinFleet(t, dir, "b")
	h := newFakeHost(t)
	inFleet(h.d, a, nil)
	h.start(t, "own")
	taken := h.start(t, "taken")
	if runs, err := h.d.ParkForStop(t.Context(), 0); err != nil || len(runs) != 2 {
		t.Fatalf("the stop's parks %+v, %v", runs, err)
	}
	h.teardown(t, "own")
	h.teardown(t, "taken")
	h.d.stopping.Store(false)

	g := record.Genesis(taken.Unit, taken.Grants)
	head, _ := h.d.st.Head("taken")
	if _, err := a.Transfer(t.Context(), g, b.Key()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(t.Context(), g, "taken", head, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	before, err := dir.Run(t.Context(), g)
	if err != nil {
		t.Fatal(err)
	}
	back := h.d.ComeBack(t.Context(), 0)
	if len(back) != 1 || back[0].Run != "own" || back[0].Err != nil || back[0].Answer == nil {
		t.Fatalf("the start's resumes %+v, want own alone", back)
	}
	if r, err := h.d.Run("taken"); err != nil || r.Status != answers.ParkedImage || h.ex.sandbox("taken") != nil {
		t.Fatalf("taken: %s, %v (sandbox %v); want it parked, no sandbox", r.Status, err, h.ex.sandbox("taken") != nil)
	}
	if e, err := dir.Run(t.Context(), g); err != nil || e.Rev != before.Rev || e.Owner != b.Key() {
		t.Fatalf("the directory moved: %+v, %v; was %+v", e, err, before)
	}
	if es, err := openComeback(h.d.cfg.StateDir).Entries(); err != nil || len(es) != 0 {
		t.Fatalf("the list holds %v, %v", es, err)
	}
	if _, err := h.d.Close(t.Context(), "own", ""); err != nil {
		t.Fatal(err)
	}
}

// A transcript run parked on its await as the daemon stops, every awaited
// result already posted: its resume is refused (the daemon stops), and it
// is listed instead, so the next start resumes it with its results.
func TestStopDuringAwaitParkListsRun(t *testing.T) {
	h := newFakeHost(t)
	h.startTranscript(t, "r")
	h.d.seam = func(step string) {
		switch step {
		case "park.checkpointed":
			if err := calls.Post(h.d.st, "r", "c1", []byte(`{"ok":true}`)); err != nil {
				t.Error(err)
			}
		case "park.appended":
			h.d.stopping.Store(true)
		}
	}
	h.awaitOne(t, "r", "c1")
	list := openComeback(h.d.cfg.StateDir)
	deadline := time.Now().Add(30 * time.Second)
	for es, _ := list.Entries(); len(es) == 0; es, _ = list.Entries() {
		if time.Now().After(deadline) {
			t.Fatal("the run parked on its await as the daemon stopped was not listed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r := h.d.runs.lock("r")
	r.mu.Unlock()
	h.d.seam = nil
	h.teardown(t, "r")
	h.d.stopping.Store(false)
	if back := h.d.ComeBack(t.Context(), 0); len(back) != 1 || back[0].Run != "r" || back[0].Err != nil {
		t.Fatalf("the start's resumes %+v, want r", back)
	}
	if got := h.kinds(t, "r"); got != "executed suspended resumed" {
		t.Fatalf("segments %s", got)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}
