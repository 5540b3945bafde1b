package daemon

import (
	"bytes"
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// stallThenFail is an export's client that takes n bytes, then stalls
// until told to fail.
type stallThenFail struct {
	n       int
	stalled chan struct{}
	fail    chan struct{}
}

func (w *stallThenFail) Write(p []byte) (int, error) {
	if w.n <= 0 {
		close(w.stalled)
		<-w.fail
		return 0, errors.New("client went away")
	}
	w.n -= len(p)
	return len(p), nil
}

// Two exports of one run: the first stalls, the operator retries and the
// retry delivers a whole bundle; the first then fails. The handoff must
// stand: a bundle is out.
func TestFailedExportKeepsAnotherExportsHandoff(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.runs = &runTable{st: h.d.st}
	h.Start(t, "r")
	h.Park(t, "r", h.TranscriptPark(t, 4096))
	w1 := &stallThenFail{n: 1, stalled: make(chan struct{}), fail: make(chan struct{})}
	done := make(chan error)
	go func() { done <- h.d.exporter.Export(t.Context(), "r", w1, true) }()
	<-w1.stalled
	var b2 bytes.Buffer
	if err := h.d.exporter.Export(t.Context(), "r", &b2, true); err != nil {
		t.Fatal(err)
	}
	close(w1.fail)
	if err := <-done; err == nil {
		t.Fatal("the stalled export did not fail")
	}
	if _, off, _ := h.d.st.HandedOff("r"); !off {
		t.Fatalf("a whole bundle (%d bytes) is out, and the run is no longer handed off", b2.Len())
	}
	// Alone, a failed export takes its handoff back.
	g := mustMetricsHost(t, "")
	g.d.runs = &runTable{st: g.d.st}
	g.Start(t, "s")
	g.Park(t, "s", g.TranscriptPark(t, 4096))
	w := &stallThenFail{n: 1, stalled: make(chan struct{}), fail: make(chan struct{})}
	close(w.fail)
	if err := g.d.exporter.Export(t.Context(), "s", w, true); err == nil {
		t.Fatal("the export did not fail")
	}
	if _, off, _ := g.d.st.HandedOff("s"); off {
		t.Fatal("a failed export, alone, left the run handed off")
	}
}

// A run handed off to another host is not listed by GET /v1/calls here:
// its calls are awaited where it lives, and a platform seeing them on two
// hosts could carry out a side effect twice. Before the handoff it is.
func TestCallsOfHandedOffRunNotListed(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.runs = &runTable{st: h.d.st}
	h.Start(t, "r")
	att := h.Put(t, []byte("attestation"))
	h.Append(t, "r", record.Execution(att, &record.CallAccount{Dispatched: []string{"pay-1"}}),
		record.Suspension(h.TranscriptPark(t, 16), h.Put(t, []byte("manifest"))))
	listed, err := calls.List(h.d.st)
	if err != nil || len(listed) != 1 || listed[0].ID != "pay-1" {
		t.Fatalf("calls before the handoff: %+v, %v", listed, err)
	}
	head, _ := h.d.st.Head("r")
	if err := h.d.st.HandOff("r", head); err != nil {
		t.Fatal(err)
	}
	if listed, err = calls.List(h.d.st); err != nil || len(listed) != 0 {
		t.Fatalf("calls of a handed-off run listed: %+v, %v", listed, err)
	}
}

// A run with a result posted here for a call it still awaits with others
// is not exported: the bundle would not carry the result.
func TestExportRefusedWithResultsHeld(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.runs = &runTable{st: h.d.st}
	h.d.cfg.StateDir = t.TempDir()
	h.d.wire()
	h.Start(t, "r")
	att := h.Put(t, []byte("attestation"))
	h.Append(t, "r", record.Execution(att, &record.CallAccount{Dispatched: []string{"c1", "c2"}}),
		record.Suspension(h.TranscriptPark(t, 16), h.Put(t, []byte("manifest"))))
	if err := h.d.exporter.Exportable("r"); err != nil {
		t.Fatalf("no result posted: %v", err)
	}
	if pr, err := h.d.PostResult(t.Context(), "r", "c1", []byte(`"ok"`)); err != nil || pr.Resumed != nil || len(pr.Awaiting) != 1 {
		t.Fatalf("post: %+v %v", pr, err)
	}
	var b bytes.Buffer
	if err := h.d.exporter.Export(t.Context(), "r", &b, true); !errors.Is(err, bundle.ErrResultsHeld) || b.Len() != 0 {
		t.Fatalf("export with a result held: %v (%d bytes written)", err, b.Len())
	}
	if _, off, _ := h.d.st.HandedOff("r"); off {
		t.Fatal("a refused export handed the run off")
	}
}
