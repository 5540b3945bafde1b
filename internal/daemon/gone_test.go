package daemon

import (
	"testing"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// lastJournal is the attestation and journal of run id's last Executed
// segment.
func (h *fakeHost) lastJournal(t *testing.T, id string) (*attest.Body, *attest.Journal) {
	t.Helper()
	raw, err := h.d.st.Raw(id)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(raw.Segments) - 1; i >= 0; i-- {
		if raw.Segments[i].Kind == record.Executed {
			return h.journalOf(t, raw.Segments[i].Attestation)
		}
	}
	t.Fatalf("run %s has no executed segment", id)
	return nil, nil
}

// journalOf is the attestation at a and its journal.
func (h *fakeHost) journalOf(t *testing.T, a record.Address) (*attest.Body, *attest.Journal) {
	t.Helper()
	body, err := openAttestation(h.d.st, a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := h.d.st.ReadAll(body.Journal)
	if err != nil {
		t.Fatal(err)
	}
	j, err := attest.DecodeJournal(jb)
	if err != nil {
		t.Fatal(err)
	}
	return body, j
}

// A restarted daemon finds image runs executing whose unit is gone, its
// container kept (the host restarted): the run resumed from a snapshot
// goes back to it, its interval journaling unit-lost, and resumes again;
// one that never parked has no snapshot to go back to and is lost; one
// with no container at all may run elsewhere, and is lost too.
func TestReconcileParksBackGoneUnit(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "resumed")
	h.start(t, "fresh")
	h.start(t, "nowhere")
	if _, err := h.d.Park(t.Context(), "resumed"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "resumed")
	st, _ := h.d.st.Run("resumed")
	snap := st.Parked.String()
	if _, err := h.d.Resume(t.Context(), "resumed", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Park(t.Context(), "nowhere"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "nowhere")
	if _, err := h.d.Resume(t.Context(), "nowhere", nil); err != nil {
		t.Fatal(err)
	}
	h.restart()
	h.ex.dropTask(t, "resumed")
	h.ex.dropTask(t, "fresh")
	if err := h.ex.sandbox("nowhere").Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := h.d.reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := h.kinds(t, "resumed"); got != "executed suspended resumed executed suspended" {
		t.Fatalf("segments %s, want the lost interval parked back", got)
	}
	st, _ = h.d.st.Run("resumed")
	if st.Phase != record.PhaseParked || st.Parked.String() != snap {
		t.Fatalf("phase %s at %v, want parked at %s", st.Phase, st.Parked, snap)
	}
	body, j := h.lastJournal(t, "resumed")
	var lost attest.UnitLost
	if !j.Find(&lost) || lost.Reason != goneReason || body.Outcome.Kind != attest.Parked {
		t.Fatalf("the lost interval: outcome %s, unit-lost %+v", body.Outcome.Kind, lost)
	}
	h.teardown(t, "resumed")
	if h.ex.taskless["resumed"] {
		t.Fatal("the parked-back run's container is left")
	}
	for _, id := range []string{"fresh", "nowhere"} {
		if r, err := h.d.Run(id); err != nil || r.Status != answers.Lost {
			t.Fatalf("%s: %s (%v), want lost", id, r.Status, err)
		}
	}
	if _, err := h.d.Resume(t.Context(), "resumed", nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"resumed", "fresh", "nowhere"} {
		if _, err := h.d.Close(t.Context(), id, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// A restarted daemon finds a transcript run executing whose unit is gone:
// it is parked at the transcript the unit left, unaccounted, its interval
// journaling unit-lost, and resumes from it.
func TestReconcileRecoversGoneTranscript(t *testing.T) {
	h := newFakeHost(t)
	h.startTranscript(t, "r")
	sid := h.liveOf("r").sb.ID()
	h.restart()
	h.ex.dropTask(t, sid)
	if err := h.d.reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := h.kinds(t, "r"); got != "executed suspended" {
		t.Fatalf("segments %s, want the lost interval and its park", got)
	}
	st, _ := h.d.st.Run("r")
	if st.Phase != record.PhaseParked || !st.Parked.IsTranscript() {
		t.Fatalf("phase %s at %v, want parked in a transcript", st.Phase, st.Parked)
	}
	raw, _ := h.d.st.Raw("r")
	_, j := h.lastJournal(t, "r")
	var lost attest.UnitLost
	var rec attest.Recovered
	if !j.Find(&lost) || !j.Find(&rec) || raw.Segments[0].Calls != nil {
		t.Fatalf("the lost interval: unit-lost %v, recovered %v, calls %v", lost, rec, raw.Segments[0].Calls)
	}
	if h.ex.taskless[sid] {
		t.Fatal("the recovered run's container is left")
	}
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}
