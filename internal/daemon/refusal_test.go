package daemon

import (
	"errors"
	"os"
	"testing"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// liveOf is run id's sandbox on this host and its interval, read under
// the run's lock.
func (h *fakeHost) liveOf(id string) *live {
	r := h.d.runs.peek(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live
}

// vanish makes sb gone under the daemon's feet (its unit killed from
// outside): every later pause, thaw or settle of it fails.
func (sb *fakeSB) vanish() {
	sb.mu.Lock()
	sb.gone = true
	sb.mu.Unlock()
}

// A park refused at its append whose thaw fails too (the sandbox went
// meanwhile) reports both failures; the record is the other writer's
// alone, and the run keeps a new interval from the refusal (park.go:82-84).
func TestParkRefusedThawFails(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	h.d.seam = func(step string) {
		if step == "park.attested" {
			head, _ := h.d.st.Head("r")
			if _, err := h.d.st.Append("r", head, record.Closure("another writer")); err != nil {
				t.Error(err)
			}
			h.ex.sandbox("r").vanish()
		}
	}
	_, err := h.d.Park(t.Context(), "r")
	if !errors.Is(err, store.ErrHeadMoved) || !errors.Is(err, executor.ErrNotFound) {
		t.Fatalf("park: %v, want the store's refusal and the thaw's failure", err)
	}
	if got := h.kinds(t, "r"); got != "closed" {
		t.Fatalf("segments %s, want only the other writer's", got)
	}
	lv := h.liveOf("r")
	if lv == nil || lv.iv.Ended() || !hasEvent(lv.iv.Events(), attest.EventParkRefused) {
		t.Fatal("no new interval after the refused append")
	}
	if _, err := os.Stat(h.d.intervals.MarkPath("r")); err != nil {
		t.Fatalf("the new interval's mark is not saved: %v", err)
	}
	forms.RemoveRun(t.Context(), h.d.ex, "r", h.d.log)
}

// A park refused before its interval ends (here: a fact of the host's
// manifest is missing) thaws the unit and goes on in the same interval:
// nothing recorded, no new interval, and the next park goes through
// (park.go:85, its false path).
func TestParkRefusedBeforeEnd(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	before := h.liveOf("r").iv
	facts := h.d.host
	h.d.forms.Facts = manifest.Manifest{}
	for k, v := range facts {
		if k != manifest.CRIUVersion {
			h.d.host[k] = v
		}
	}
	_, err := h.d.Park(t.Context(), "r")
	if !errors.Is(err, manifest.ErrMissing) {
		t.Fatalf("park without the CRIU version: %v, want manifest.ErrMissing", err)
	}
	if got := h.kinds(t, "r"); got != "" {
		t.Fatalf("segments %q after a park refused before its end", got)
	}
	sb := h.ex.sandbox("r")
	if sb == nil || sb.status != "running" || sb.settles == 0 {
		t.Fatal("the unit was not settled running after the refused park")
	}
	lv := h.liveOf("r")
	if lv == nil || lv.iv != before || lv.iv.Ended() || hasEvent(lv.iv.Events(), attest.EventParkRefused) {
		t.Fatal("the interval did not go on as it was")
	}
	h.d.forms.Facts = facts
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	if got := h.kinds(t, "r"); got != "executed suspended" {
		t.Fatalf("segments %s", got)
	}
	h.teardown(t, "r")
}

// otherInterval is another writer's interval on run id's sandbox, ended
// and recorded (an Executed segment, attested in its place): the record
// moves on and stays active.
func (h *fakeHost) otherInterval(t *testing.T, id string, u *forms.Unit) {
	t.Helper()
	iv := h.d.intervals.Begin(id, u.Sandbox, u.Grants.Limits, "another writer", h.d.intervals.MarkNow(id))
	rec := h.d.intervals
	rec.Store = h.d.fleet.Records()
	if _, err := rec.End(t.Context(), iv, nil, interval.Ending{Outcome: attest.Outcome{Kind: attest.Killed}}); err != nil {
		t.Error(err)
	}
}

// A unit's exit the store refuses while the run stays executing (the
// record moved on without closing it) leaves the run in a new interval
// (exit-refused), closable: the first close records it and destroys the
// sandbox (start.go's watch; it used to keep the ended interval, so the
// first close failed with interval.ErrSeal and only a second one closed).
func TestCloseAfterExitRefused(t *testing.T) {
	h := newFakeHost(t)
	h.start(t, "r")
	u := h.liveOf("r").unit
	h.exitRefused(t, "r", func() { h.otherInterval(t, "r", u) })
	if got := h.kinds(t, "r"); got != "executed" {
		t.Fatalf("segments %s, want only the other writer's", got)
	}
	if lv := h.liveOf("r"); lv == nil || lv.iv.Ended() || !hasEvent(lv.iv.Events(), attest.EventExitRefused) {
		t.Fatal("no new interval after the refused exit")
	}
	if _, err := h.d.Close(t.Context(), "r", "done"); err != nil {
		t.Fatalf("close after a refused exit: %v", err)
	}
	if got := h.kinds(t, "r"); got != "executed executed closed" {
		t.Fatalf("segments %s", got)
	}
	if h.ex.sandbox("r") != nil {
		t.Fatal("the exited unit's sandbox outlived the close")
	}
}
