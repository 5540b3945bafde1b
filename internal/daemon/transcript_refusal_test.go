package daemon

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/pkg/attest"
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
	for _, r := range h.d.table() {
		r.mu.Lock()
		if r.live != nil {
			r.live.unit.Stop()
		}
		r.mu.Unlock()
	}
	h.d.stop()
	h.d.bg.Wait()
	h.d.runs = map[string]*run{}
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
	if st.Phase != record.Parked || !st.Parked.IsTranscript() {
		t.Fatalf("phase %s at %v, want parked in a transcript", st.Phase, st.Parked)
	}
	raw, _ := h.d.st.Raw("r")
	b, err := h.d.attestation(raw.Segments[0].Attestation)
	if err != nil || b.Outcome.Kind != attest.Parked || raw.Segments[0].Calls != nil {
		t.Fatalf("the recovered interval: %+v %v", b, err)
	}
	if h.ex.sandbox(sid) != nil {
		t.Fatal("the orphaned unit's sandbox outlived its recovery")
	}
	if _, err := os.Stat(calls.ChannelDir(h.d.cfg.StateDir, "r")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dead channel's directory is left: %v", err)
	}
	if _, err := h.d.Resume(t.Context(), "r"); err != nil {
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
