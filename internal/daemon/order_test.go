package daemon

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The whole walk of an image run, in order: the sandbox destroyed only
// after a park is recorded, a resume restoring exactly the images that
// park stored, and a close leaving no sandbox.
func TestImageWalkInOrder(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	if sb := h.ex.sandbox("r"); sb == nil || sb.status != "running" {
		t.Fatal("no running sandbox after start")
	}
	h.d.seam = func(step string) {
		if step == "park.appended" && h.ex.sandbox("r") == nil {
			t.Error("the sandbox was destroyed before the park was recorded")
		}
	}
	p, err := h.d.Park(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	if h.ex.sandbox("r") != nil {
		t.Fatal("the parked sandbox outlived its teardown")
	}
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if got := h.ex.restores; len(got) != 1 || got[0] != "core of r, checkpoint 1" {
		t.Fatalf("restores read %q", got)
	}
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if got := h.ex.restores; len(got) != 2 || got[1] != "core of r, checkpoint 2" {
		t.Fatalf("the second resume read %q", got)
	}
	c, err := h.d.Close(t.Context(), "r", "done")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.kinds(t, "r"), "executed suspended resumed executed suspended resumed executed closed"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	if c.Status != answers.Closed || len(h.ex.sbs) != 0 {
		t.Fatalf("after close: %s, %d sandboxes", c.Status, len(h.ex.sbs))
	}
	if p.Snapshot.Validate() != nil || p.Receipt.Method == "" {
		t.Fatalf("park result %+v", p)
	}
}

// A park's manifest is the host's, not the snapshot's: it is stored while
// the checkpoint runs, and the park records that one.
func TestParkStoresManifestDuringCheckpoint(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	r, err := h.d.runs.lockRun("r")
	if err != nil {
		t.Fatal(err)
	}
	spec := r.live.unit.Spec
	r.mu.Unlock()
	st, err := h.d.st.Run("r")
	if err != nil {
		t.Fatal(err)
	}
	m, err := h.d.forms.Over(t.Context(), manifest.ImageKeys, spec, st.Unit)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := record.Sum(b)
	var during bool
	h.ex.onCheckpoint = func(string) {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !during; time.Sleep(time.Millisecond) {
			during = h.d.st.Has(want)
		}
	}
	p, err := h.d.Park(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	if !during || p.Manifest != want {
		t.Fatalf("manifest stored during the checkpoint: %v; recorded %s, want %s", during, p.Manifest, want)
	}
}

// A checkpoint that fails records nothing: the unit is settled running in
// the same interval, and the next park goes through.
func TestParkRefusedByCheckpoint(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	h.ex.checkpointErr = executor.ErrCheckpoint
	_, err := h.d.Park(t.Context(), "r")
	if !errors.Is(err, executor.ErrCheckpoint) {
		t.Fatalf("park with a failing checkpoint: %v", err)
	}
	sb := h.ex.sandbox("r")
	if got := h.kinds(t, "r"); got != "" || sb.status != "running" || sb.settles == 0 {
		t.Fatalf("after a refused park: segments %q, sandbox %s, settled %d times", got, sb.status, sb.settles)
	}
	if r, _ := h.d.Run("r"); r.Status != answers.Running {
		t.Fatalf("status %s", r.Status)
	}
	h.ex.checkpointErr = nil
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	if got := h.kinds(t, "r"); got != "executed suspended" {
		t.Fatalf("segments %s", got)
	}
}

// The record moves under a park between its sealing and its append (here
// another writer closes the run): the append is refused, the unit goes on
// settled, and a new interval is open from the refusal.
func TestParkRefusedAtAppend(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	h.d.seam = func(step string) {
		if step == "park.attested" {
			head, _ := h.d.st.Head("r")
			if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
				t.Error(err)
			}
		}
	}
	_, err := h.d.Park(t.Context(), "r")
	if !errors.Is(err, store.ErrHeadMoved) {
		t.Fatalf("park: %v, want the store's refusal", err)
	}
	if got := h.kinds(t, "r"); got != "closed" {
		t.Fatalf("segments %s, want only the other writer's", got)
	}
	sb := h.ex.sandbox("r")
	if sb == nil || sb.status != "running" || sb.settles == 0 {
		t.Fatal("the unit was not settled running after the refused append")
	}
	lv := h.d.runs.peek("r").live
	if lv == nil || lv.iv.Ended() || !hasEvent(lv.iv.Events(), "park-refused") {
		t.Fatal("no new interval after the refused append")
	}
	if _, err := os.Stat(h.d.intervals.MarkPath("r")); err != nil {
		t.Fatalf("the new interval's mark is not saved: %v", err)
	}
	forms.RemoveRun(t.Context(), h.d.ex, "r", h.d.log)
}

func hasEvent(es []attest.Entry, prefix string) bool {
	for _, e := range es {
		if strings.HasPrefix(string(e.Data), prefix) {
			return true
		}
	}
	return false
}

// A resume whose snapshot is not the recorded one is refused before any
// sandbox is made, and leaves the run parked and resumable once the
// bytes are back.
func TestResumeRefusedLeavesRunParked(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	st, _ := h.d.st.Run("r")
	es, err := h.d.st.Listing(*st.Parked.Memory)
	if err != nil {
		t.Fatal(err)
	}
	var core record.Address
	for _, e := range es {
		if e.Name == "core-1.img" {
			core = e.Address
		}
	}
	p := h.d.st.Path(core)
	orig, _ := os.ReadFile(p)
	os.Chmod(p, 0o600)
	if err := os.WriteFile(p, []byte("core of another unit"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = h.d.Resume(t.Context(), "r", nil)
	var se *resume.SnapshotError
	if !errors.As(err, &se) {
		t.Fatalf("resume of an edited image: %v", err)
	}
	if len(h.ex.restores) != 0 || h.ex.sandbox("r") != nil {
		t.Fatal("a refused resume made a sandbox")
	}
	if r, _ := h.d.Run("r"); r.Phase != record.PhaseParked {
		t.Fatalf("phase %s after a refused resume", r.Phase)
	}
	if err := os.WriteFile(p, orig, 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}

// An image resume has the executor read the restore's programs in while
// it rehashes the snapshot (executor.Client.Prefetch); a park does not.
func TestImageResumePrefetches(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	if n := h.ex.prefetches.Load(); n != 0 {
		t.Fatalf("%d prefetches before the resume", n)
	}
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if n := h.ex.prefetches.Load(); n != 1 {
		t.Fatalf("%d prefetches for one image resume, want 1", n)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}

// A restore that fails records nothing; a Resumed segment the store
// refuses destroys the restored sandbox. Either way the run stays parked.
func TestResumeRefusedAtRestoreAndAtAppend(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	h.ex.restoreErr = executor.ErrRestore
	if _, err := h.d.Resume(t.Context(), "r", nil); !errors.Is(err, executor.ErrRestore) {
		t.Fatalf("resume with a failing restore: %v", err)
	}
	h.ex.restoreErr = nil
	h.d.seam = func(step string) {
		if step == "resume.restored" {
			head, _ := h.d.st.Head("r")
			if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
				t.Error(err)
			}
		}
	}
	// The Resumed segment is appended at the head it was judged (and, in
	// a fleet, reserved) at: the record moved since, so the store refuses.
	if _, err := h.d.Resume(t.Context(), "r", nil); !errors.Is(err, store.ErrHeadMoved) {
		t.Fatalf("resume with a refused append: %v", err)
	}
	if h.ex.sandbox("r") != nil {
		t.Fatal("the restored sandbox outlived the refused append")
	}
	if _, err := os.Stat(h.d.intervals.MarkPath("r")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused resume left its interval's mark: %v", err)
	}
	if got := h.kinds(t, "r"); got != "executed suspended closed" {
		t.Fatalf("segments %s", got)
	}
}

// Close of a running unit records its interval (killed) and the Closed
// segment together, then destroys the sandbox; refused at the append, the
// unit goes on in a new interval.
func TestCloseInOrder(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	var moved bool
	h.d.seam = func(step string) {
		if step == "close.sealed" && !moved {
			moved = true
			head, _ := h.d.st.Head("r")
			if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
				t.Error(err)
			}
		}
		if step == "close.appended" && h.ex.sandbox("r") == nil {
			t.Error("the sandbox was destroyed before the close was recorded")
		}
	}
	if _, err := h.d.Close(t.Context(), "r", "first"); !errors.Is(err, store.ErrHeadMoved) {
		t.Fatalf("close refused at the append: %v", err)
	}
	if sb := h.ex.sandbox("r"); sb == nil || sb.status != "running" {
		t.Fatal("the unit did not go on after a refused close")
	}
	forms.RemoveRun(t.Context(), h.d.ex, "r", h.d.log)

	h2 := newFakeHost(t)
	h2.start(t, "s")
	h2.d.seam = func(step string) {
		if step == "close.appended" && h2.ex.sandbox("s") == nil {
			t.Error("the sandbox was destroyed before the close was recorded")
		}
	}
	if _, err := h2.d.Close(t.Context(), "s", "finished"); err != nil {
		t.Fatal(err)
	}
	if got := h2.kinds(t, "s"); got != "executed closed" || h2.ex.sandbox("s") != nil {
		t.Fatalf("segments %s; sandbox left: %v", got, h2.ex.sandbox("s") != nil)
	}
	raw, _ := h2.d.st.Raw("s")
	b, err := openAttestation(h2.d.st, raw.Segments[0].Attestation)
	if err != nil || b.Outcome.Kind != attest.Killed {
		t.Fatalf("the closed interval's outcome: %+v %v", b, err)
	}
}

// A unit that exits by itself closes its run: its interval (exited, with
// the code) and a Closed segment saying so.
func TestExitClosesRun(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	h.ex.sandbox("r").exitWith(3)
	deadline := time.Now().Add(10 * time.Second)
	for h.kinds(t, "r") != "executed closed" {
		if time.Now().After(deadline) {
			t.Fatalf("segments %q long after the unit exited", h.kinds(t, "r"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	raw, _ := h.d.st.Raw("r")
	b, err := openAttestation(h.d.st, raw.Segments[0].Attestation)
	if err != nil || b.Outcome.Kind != attest.Exited || b.Outcome.Code != 3 || raw.Segments[1].Reason != "unit exited with code 3" {
		t.Fatalf("exit recorded as %+v (%v), %q", b.Outcome, err, raw.Segments[1].Reason)
	}
}

// A restarted daemon makes containerd agree with the records: a sandbox
// no executing run owns is removed, an executing run's frozen unit is
// thawed and taken back, and a run without a sandbox is reported lost.
func TestReconcileAfterRestart(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "kept")
	h.start(t, "lost")
	h.start(t, "parked")
	if _, err := h.d.Park(t.Context(), "parked"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "parked")
	// The restart: this process's runs forgotten, containerd as it was,
	// plus a sandbox of no run, a frozen unit, and a lost one.
	h.d.stop()
	h.d.bg.Wait()
	if _, err := h.ex.add("ghost"); err != nil {
		t.Fatal(err)
	}
	h.ex.sandbox("kept").set("paused")
	h.ex.sandbox("lost").Destroy(t.Context())
	d := h.d
	d.runs = &runTable{st: d.st}
	d.bgCtx, d.stop = contextWithCancel()
	if err := d.reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if h.ex.sandbox("ghost") != nil {
		t.Fatal("the sandbox of no run survived the reconcile")
	}
	if sb := h.ex.sandbox("kept"); sb == nil || sb.status != "running" || sb.settles == 0 {
		t.Fatal("the frozen unit was not thawed")
	}
	for id, want := range map[string]answers.Status{"kept": answers.Running, "lost": answers.Lost, "parked": answers.ParkedImage} {
		if r, err := d.Run(id); err != nil || r.Status != want {
			t.Errorf("%s: %s (%v), want %s", id, r.Status, err, want)
		}
	}
	for _, id := range []string{"kept", "lost", "parked"} {
		if _, err := d.Close(t.Context(), id, ""); err != nil {
			t.Fatal(err)
		}
	}
	if len(h.ex.sbs) != 0 {
		t.Fatalf("%d sandboxes after closing every run", len(h.ex.sbs))
	}
}

// A run whose genesis the store refuses after its sandbox started (here
// another writer stored a run of that id in between) leaves nothing of
// its own: the sandbox is destroyed, the interval's mark dropped, and the
// other writer's run is as it was.
func TestStartRefusedAtGenesis(t *testing.T) {
	h := newFakeHost(t)
	var other record.Address
	h.d.seam = func(step string) {
		if step == "start.sandboxed" {
			u, _ := h.d.st.PutBytes([]byte("another unit"))
			g, _ := h.d.st.PutBytes([]byte("another grant set"))
			var err error
			if other, err = h.d.st.Create("r", u, g); err != nil {
				t.Error(err)
			}
		}
	}
	_, err := h.d.Start(t.Context(), "r", unit.Spec{Image: fakeImage, Args: []string{"/unit"}}, unit.Grants{})
	if !errors.Is(err, store.ErrRunExists) {
		t.Fatalf("start: %v, want the store's refusal", err)
	}
	if head, err := h.d.st.Head("r"); err != nil || head != other {
		t.Fatalf("the other writer's run is at %s (%v), want its genesis %s", head, err, other)
	}
	if sb := h.ex.sandbox("r"); sb != nil {
		t.Fatalf("the refused run's sandbox is left, %s", sb.status)
	}
	if _, err := os.Stat(h.d.intervals.MarkPath("r")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused run's mark is left: %v", err)
	}
}

// A unit's exit that the store refuses to record (the record moved: here
// another writer closed the run) records nothing of the daemon's; the
// record stays the other writer's, and verifies.
func TestExitRefusedAtAppend(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	h.exitRefused(t, "r", func() {
		head, _ := h.d.st.Head("r")
		if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
			t.Error(err)
		}
	})
	if got := h.kinds(t, "r"); got != "closed" {
		t.Fatalf("segments %s, want only the other writer's", got)
	}
	if _, err := h.d.st.Record("r"); err != nil {
		t.Fatal(err)
	}
	forms.RemoveRun(t.Context(), h.d.ex, "r", h.d.log)
}

// exitRefused ends run id's unit by itself (code 0), has refuse move its
// record on once the exit's interval is sealed (seam exit.sealed), and
// returns once the exit's append has been refused.
func (h *fakeHost) exitRefused(t *testing.T, id string, refuse func()) {
	t.Helper()
	refused := make(chan struct{})
	h.d.seam = func(step string) {
		if step == "exit.sealed" {
			refuse()
			close(refused)
		}
	}
	h.ex.sandbox(id).exitWith(0)
	select {
	case <-refused:
	case <-time.After(10 * time.Second):
		t.Fatal("the exit was never sealed")
	}
	// The watcher appends under the run's lock: once it is free, the
	// exit's append has been refused.
	r := h.d.runs.lock(id)
	r.mu.Unlock()
	h.d.seam = nil
}

// A transcript park refused at its append (the record moved: here another
// writer closed the run) records nothing of the daemon's: the frozen unit
// is thawed, and a new interval is open from the refusal.
func TestTranscriptParkRefusedAtAppend(t *testing.T) {
	h := newFakeHost(t)
	if _, err := h.d.Start(t.Context(), "r", unit.Spec{Image: fakeImage, Args: []string{"/unit"}, Mode: unit.TranscriptMode}, unit.Grants{}); err != nil {
		t.Fatal(err)
	}
	h.d.seam = func(step string) {
		if step == "park.attested" {
			head, _ := h.d.st.Head("r")
			if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
				t.Error(err)
			}
		}
	}
	if _, err := h.d.Park(t.Context(), "r"); !errors.Is(err, store.ErrHeadMoved) {
		t.Fatalf("park: %v, want the store's refusal", err)
	}
	if got := h.kinds(t, "r"); got != "closed" {
		t.Fatalf("segments %s, want only the other writer's", got)
	}
	lv := h.d.runs.peek("r").live
	if lv == nil || lv.iv.Ended() || !hasEvent(lv.iv.Events(), "park-refused") {
		t.Fatal("no new interval after the refused append")
	}
	if sb := h.ex.sandbox(lv.sb.ID()); sb == nil || sb.status != "running" {
		t.Fatal("the unit was not thawed after the refused append")
	}
	r := h.d.runs.peek("r")
	r.mu.Lock()
	lv.stopping = true
	lv.destroy(h.d.log)
	r.live = nil
	r.mu.Unlock()
}

// A daemon reconciles before its image-park gate exists (New): a run it
// reattached then parks once the gate is there, through the gate of the
// daemon as it is at the park.
func TestReattachedBeforeGateParks(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	h.d.stop()
	h.d.bg.Wait()
	d := h.d
	d.runs = &runTable{st: d.st}
	d.bgCtx, d.stop = contextWithCancel()
	d.probe = nil
	if err := d.reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	startProbe(d)
	if _, err := d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}
