package daemon

import (
	"bytes"
	"errors"
	"testing"
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
	h.d.runs = map[string]*run{}
	h.start(t, "r")
	h.park(t, "r", h.transcriptPark(t, 4096))
	w1 := &stallThenFail{n: 1, stalled: make(chan struct{}), fail: make(chan struct{})}
	done := make(chan error)
	go func() { done <- h.d.Export(t.Context(), "r", w1, true) }()
	<-w1.stalled
	var b2 bytes.Buffer
	if err := h.d.Export(t.Context(), "r", &b2, true); err != nil {
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
	g.d.runs = map[string]*run{}
	g.start(t, "s")
	g.park(t, "s", g.transcriptPark(t, 4096))
	w := &stallThenFail{n: 1, stalled: make(chan struct{}), fail: make(chan struct{})}
	close(w.fail)
	if err := g.d.Export(t.Context(), "s", w, true); err == nil {
		t.Fatal("the export did not fail")
	}
	if _, off, _ := g.d.st.HandedOff("s"); off {
		t.Fatal("a failed export, alone, left the run handed off")
	}
}
