package daemon

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// startTranscript starts a transcript-mode run id.
func (h *fakeHost) startTranscript(t *testing.T, id string) {
	t.Helper()
	if _, err := h.d.Start(t.Context(), id, unit.Spec{Image: fakeImage, Args: []string{"/unit"}, Mode: unit.TranscriptMode}, unit.Grants{}); err != nil {
		t.Fatal(err)
	}
}

// restart stops the daemon's goroutines and forgets its runs, as a
// restarted process would: each transcript channel stops serving, its
// directory left; containerd (the fake) stays as it was.
func (h *fakeHost) restart() {
	for _, r := range h.d.runs.all() {
		r.mu.Lock()
		if r.live != nil {
			r.live.unit.Stop()
		}
		r.mu.Unlock()
	}
	h.d.stop()
	h.d.bg.Wait()
	h.d.runs = &runTable{st: h.d.st}
	h.d.bgCtx, h.d.stop = contextWithCancel()
}

// loggedErrors makes the daemon's error-level log lines into errors on
// the channel it returns.
func loggedErrors(d *Daemon) chan error {
	errs := make(chan error, 16)
	d.log = slog.New(errorsTo{d.log.Handler(), errs})
	return errs
}

// A restarted daemon finds a transcript unit whose channel died with the
// last one: it records the interval, unaccounted (recovered), parked at
// the transcript the unit left, and destroys the sandbox (reconcile.go's
// orphaned branch, transcript.go's recoverUnit).
func TestReconcileRecoversOrphanedTranscript(t *testing.T) {
	h := newFakeHost(t)
	h.startTranscript(t, "r")
	sid := h.liveOf("r").sb.ID()
	h.restart()
	if err := h.d.reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := h.kinds(t, "r"); got != "executed suspended" {
		t.Fatalf("segments %s, want the recovered interval and its park", got)
	}
	st, _ := h.d.st.Run("r")
	if st.Phase != record.PhaseParked || !st.Parked.IsTranscript() {
		t.Fatalf("phase %s at %v, want parked in a transcript", st.Phase, st.Parked)
	}
	raw, _ := h.d.st.Raw("r")
	b, err := openAttestation(h.d.st, raw.Segments[0].Attestation)
	if err != nil || b.Outcome.Kind != attest.Parked || raw.Segments[0].Calls != nil {
		t.Fatalf("the recovered interval: %+v %v", b, err)
	}
	if h.ex.sandbox(sid) != nil {
		t.Fatal("the orphaned unit's sandbox outlived its recovery")
	}
	if _, err := os.Stat(calls.ChannelDir(h.d.cfg.StateDir, "r")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dead channel's directory is left: %v", err)
	}
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}

// The recovery's record refused (another writer closed the run as the
// unit was frozen): nothing of the daemon's is recorded, the sandbox is
// destroyed, and the run is reported lost; the daemon starts all the same
// (transcript.go's recoverUnit refusal, reconcile.go's destroy and "lost").
func TestReconcileRecoveryRefused(t *testing.T) {
	h := newFakeHost(t)
	h.startTranscript(t, "r")
	sid := h.liveOf("r").sb.ID()
	h.restart()
	errs := loggedErrors(h.d)
	h.ex.onPause = func(string) {
		head, _ := h.d.st.Head("r")
		if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
			t.Error(err)
		}
	}
	if err := h.d.reconcile(t.Context()); err != nil {
		t.Fatalf("a refused recovery kept the daemon from starting: %v", err)
	}
	if got := h.kinds(t, "r"); got != "closed" {
		t.Fatalf("segments %s, want only the other writer's", got)
	}
	if h.ex.sandbox(sid) != nil {
		t.Fatal("the unit whose recovery was refused kept its sandbox")
	}
	select {
	case err := <-errs:
		if !errors.Is(err, record.ErrClosed) || !strings.Contains(err.Error(), "lost") {
			t.Fatalf("logged %v, want the run reported lost with the record's refusal", err)
		}
	default:
		t.Fatal("the refused recovery was not logged")
	}
}

// awaitOne has transcript run id's unit dispatch call and await it, over
// its channel's socket, as a unit in its sandbox does.
func (h *fakeHost) awaitOne(t *testing.T, id, call string) {
	t.Helper()
	c, err := protocol.Dial(filepath.Join(calls.ChannelDir(h.d.cfg.StateDir, id), protocol.SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Hello(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Dispatch(t.Context(), protocol.Call{ID: call, Kind: "build"}); err != nil {
		t.Fatal(err)
	}
	if parking, err := c.Await(t.Context(), call); err != nil || !parking {
		t.Fatalf("await: %v %v", parking, err)
	}
}

// waitEvent waits for the first event of kind on es.
func waitEvent(t *testing.T, es <-chan events.Event, kind string) events.Event {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case e := <-es:
			if e.Kind == kind {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s event", kind)
		}
	}
}

// withoutFact is the host's facts but key: a host a resume's manifest
// check refuses.
func withoutFact(facts manifest.Manifest, key string) manifest.Manifest {
	m := manifest.Manifest{}
	for k, v := range facts {
		if k != key {
			m[k] = v
		}
	}
	return m
}

// dropLive destroys run id's sandbox as a close would, leaving the record.
func (h *fakeHost) dropLive(id string) {
	r := h.d.runs.lock(id)
	defer r.mu.Unlock()
	if lv := r.live; lv != nil {
		lv.stopping = true
		lv.destroy(h.d.log)
		r.live = nil
	}
}

// A park on an await refused at its append (another writer closed the
// run): the platform sees run.park_failed with the refusal, nothing of
// the daemon's is recorded, and the unit goes on thawed in a new interval
// (transcript.go's Awaiting).
func TestParkOnAwaitRefused(t *testing.T) {
	h := newFakeHost(t)
	errs := loggedErrors(h.d)
	h.startTranscript(t, "r")
	es, cancel := h.d.events.Subscribe()
	defer cancel()
	h.d.seam = func(step string) {
		if step == "park.attested" {
			head, _ := h.d.st.Head("r")
			if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
				t.Error(err)
			}
		}
	}
	h.awaitOne(t, "r", "c1")
	e := waitEvent(t, es, "run.park_failed")
	if !strings.Contains(e.Detail, store.ErrHeadMoved.Error()) {
		t.Fatalf("run.park_failed says %q, want the store's refusal", e.Detail)
	}
	if err := <-errs; !errors.Is(err, store.ErrHeadMoved) {
		t.Fatalf("logged %v", err)
	}
	if got := h.kinds(t, "r"); got != "closed" {
		t.Fatalf("segments %s, want only the other writer's", got)
	}
	lv := h.liveOf("r")
	if lv == nil || lv.iv.Ended() || !hasEvent(lv.iv.Events(), attest.EventParkRefused) {
		t.Fatal("no new interval after the refused park")
	}
	if sb := h.ex.sandbox(lv.sb.ID()); sb == nil || sb.status != "running" {
		t.Fatal("the unit was not thawed after the refused park")
	}
	h.dropLive("r")
}

// Every awaited result posted before the await's park was recorded: the
// park's resume that follows, refused (this host's manifest no longer
// matches the park's), is logged; the run stays parked with the result
// kept, and a later resume delivers it (transcript.go's parkAwaiting).
func TestResumeAfterAwaitParkRefused(t *testing.T) {
	h := newFakeHost(t)
	errs := loggedErrors(h.d)
	h.startTranscript(t, "r")
	facts := h.d.host
	h.d.seam = func(step string) {
		switch step {
		case "park.checkpointed":
			if err := calls.Post(h.d.st, "r", "c1", []byte(`{"ok":true}`)); err != nil {
				t.Error(err)
			}
		case "park.appended":
			h.d.forms.Facts = withoutFact(facts, manifest.Arch)
		}
	}
	h.awaitOne(t, "r", "c1")
	var me *resume.ManifestError
	if err := <-errs; !errors.As(err, &me) || !strings.Contains(err.Error(), "resume after park") {
		t.Fatalf("logged %v, want the resume's refusal", err)
	}
	r := h.d.runs.lock("r")
	r.mu.Unlock()
	h.d.seam = nil
	if got := h.kinds(t, "r"); got != "executed suspended" {
		t.Fatalf("segments %s", got)
	}
	if st, _ := h.d.st.Run("r"); st.Phase != record.PhaseParked {
		t.Fatalf("phase %s", st.Phase)
	}
	if cs, err := calls.List(h.d.st); err != nil || len(cs) != 1 || !cs[0].ResultPosted {
		t.Fatalf("calls %+v %v, want the result kept", cs, err)
	}
	h.teardown(t, "r")
	h.d.forms.Facts = facts
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}

// The platform posts the last awaited result of a parked run whose
// resume this host refuses (its manifest no longer matches the park's):
// the post is taken, and answers the resume's refusal (ResumeErr); the
// run stays parked, and a later resume delivers the result
// (transcript.go's PostResult).
func TestPostResultResumeRefused(t *testing.T) {
	h := newFakeHost(t)
	h.startTranscript(t, "r")
	es, cancel := h.d.events.Subscribe()
	defer cancel()
	h.awaitOne(t, "r", "c1")
	waitEvent(t, es, "run.parked")
	r := h.d.runs.lock("r") // the park on await is done with the run
	r.mu.Unlock()
	h.teardown(t, "r")
	facts := h.d.host
	h.d.forms.Facts = withoutFact(facts, manifest.Arch)
	out, err := h.d.PostResult(t.Context(), "r", "c1", []byte(`{"ok":true}`))
	var me *resume.ManifestError
	if err != nil || !errors.As(out.ResumeErr, &me) || out.Resumed != nil {
		t.Fatalf("post: %+v %v, want the result taken and the resume's refusal", out, err)
	}
	if got := h.kinds(t, "r"); got != "executed suspended" {
		t.Fatalf("segments %s", got)
	}
	if cs, err := calls.List(h.d.st); err != nil || len(cs) != 1 || !cs[0].ResultPosted {
		t.Fatalf("calls %+v %v, want the result kept", cs, err)
	}
	h.d.forms.Facts = facts
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}

// A restarted daemon removes the trees of the restores the last one laid
// out and never finished (forms.RestoreDir) of runs with no sandbox here:
// each holds links to stored objects, which would keep their bytes on
// disk past a collection, or a pages file written from chunks, as large
// as the image. A run whose sandbox stays keeps its tree.
func TestReconcileRemovesRestoreTrees(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "kept")
	for _, id := range []string{"r", "kept"} {
		left := filepath.Join(h.d.cfg.StateDir, forms.RestoreDir, id, "images")
		if err := os.MkdirAll(left, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(left, "pages-1.img"), make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h.restart()
	if err := h.d.reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.d.cfg.StateDir, forms.RestoreDir, "r")); !os.IsNotExist(err) {
		t.Fatalf("the last daemon's restore trees after the start: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.d.cfg.StateDir, forms.RestoreDir, "kept", "images", "pages-1.img")); err != nil {
		t.Fatalf("the tree of a run whose sandbox stays: %v", err)
	}
}
