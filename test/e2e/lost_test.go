//go:build linux

package e2e

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCloseLostRun closes a run that is executing in its record but that
// the daemon could not take back at start (lost) while its unit lives on:
// the close removes the sandbox, unit and shim included.
func TestCloseLostRun(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := mustDaemon(t, "lost")
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "gone"
	startOracle(t, d, id, oracleImage)
	mustStop(t, d)
	// The restarted daemon cannot reopen the unit's output (a file
	// stands where the run's output directory was), so it cannot take
	// the sandbox back: the run is lost, its unit still running.
	out := filepath.Join(d.state, "runs", id)
	if err := os.Rename(out, out+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mustStart(t, d)
	r, err := d.run(ctx, id)
	if err != nil || r.Status != "lost" {
		t.Fatalf("after a restart that could not reattach: %+v, %v", r, err)
	}
	if len(d.sandboxProcesses(id)) == 0 {
		t.Fatal("the lost run's sandbox is not running: nothing to test")
	}
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(out+".moved", out); err != nil {
		t.Fatal(err)
	}
	c, err := d.c.Close(ctx, id, "lost")
	if err != nil || c.Status != "closed" {
		t.Fatalf("close: %+v, %v", c, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for left := d.sandboxProcesses(id); len(left) > 0; left = d.sandboxProcesses(id) {
		if time.Now().After(deadline) {
			t.Fatalf("after closing the lost run, its sandbox is still running: %s", strings.Join(left, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The shim gone, the unit's last processes may still be leaving
	// their cgroups (seen once under the suite's load): they must be
	// gone within a few seconds.
	for n := d.cgroupProcs(); n != 0; n = d.cgroupProcs() {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes left in the daemon's cgroups after the close", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestExportRefusesUnparked: only a parked run can be exported; an
// executing or closed one is refused with a phase error, and nothing is
// written.
func TestExportRefusesUnparked(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := shared(t)
	const id = "not-parked"
	startOracle(t, d, id, oracleImage)
	was, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	err = d.c.Export(ctx, id, io.Discard)
	t.Logf("export of an executing run: %v", apiError(t, err, "phase"))
	unchanged(t, d, id, was)
	if _, err := d.c.Close(ctx, id, "e2e"); err != nil {
		t.Fatal(err)
	}
	err = d.c.Export(ctx, id, io.Discard)
	t.Logf("export of a closed run: %v", apiError(t, err, "phase"))
}
