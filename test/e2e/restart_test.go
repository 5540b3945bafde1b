//go:build linux

package e2e

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

// TestDaemonRestart stops the daemon with SIGTERM under a running unit —
// it must exit 0 promptly, and the unit goes on without it, its output
// waiting in the shim's pipe — and starts it again on the same state
// directory: the run is running (reattached), no output is lost, it parks
// and resumes, and the oracle's state is intact across all of it. The
// first interval's attestation and journal must cover the whole interval,
// from the run's start across the restart to the park.
func TestDaemonRestart(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := mustDaemon(t, "restart")
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "restart"
	startOracle(t, d, id, oracleImage)
	t.Run("SIGTERMWithUnitRunning", func(t *testing.T) {
		// The daemon is stopped when this returns, killed if SIGTERM
		// did not stop it: the test goes on either way.
		if err := d.stop(); err != nil {
			t.Error(err)
		}
	})
	stopped := time.Now()
	// No daemon: the unit goes on under its shim. Its output waits in
	// the shim's pipe until a daemon reads it again.
	time.Sleep(time.Second)
	restarted := time.Now()
	mustStart(t, d)
	ls := waitLines(t, d.stdout(id), "a line written after the restart", func(ls []line) bool {
		return len(ls) > 0 && last(ls).Time > restarted.UnixNano()
	})
	down := 0
	for _, l := range ls {
		if l.Time > stopped.UnixNano() && l.Time < restarted.UnixNano() {
			down++
		}
	}
	if down < 5 {
		t.Fatalf("%d lines written in the %v the daemon was down", down, restarted.Sub(stopped))
	}

	r, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Phase != "executing" || r.Status != "running" || r.Segments != 0 {
		t.Fatalf("after the restart: %+v, want running (reattached)", r)
	}
	checkOneProcess(t, output(t, d.stdout(id)))

	_, atPark := park(t, d, id)
	resume(t, d, id, nil, atPark)
	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), "executed suspended resumed"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}

	// The first interval ran from the run's start to the park, across the
	// restart: its attestation and replay journal cover all of it.
	t.Run("IntervalSpansRestart", func(t *testing.T) {
		body, j := d.journal(t, s.Segments[0])
		out, err := os.ReadFile(d.stdout(id))
		if err != nil {
			t.Fatal(err)
		}
		first := output(t, d.stdout(id))[0]
		got := stdoutOf(j)
		if body.StartNS > first.Time || !bytes.HasPrefix(out, got) || !bytes.Contains(got, []byte(`{"counter":1,`)) {
			t.Errorf("interval 1 is attested from %v, but the unit wrote its first line at %v; its journal holds %d bytes of stdout (from the file's start: %v; with the first line: %v)",
				time.Unix(0, body.StartNS).UTC().Format(time.StampMicro), time.Unix(0, first.Time).UTC().Format(time.StampMicro),
				len(got), bytes.HasPrefix(out, got), bytes.Contains(got, []byte(`{"counter":1,`)))
		}
	})
}
