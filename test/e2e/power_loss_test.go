//go:build linux

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// TestPowerLoss cuts a host's power under its runs: the daemon is killed
// with SIGKILL, with no stop to park anything, and then the rest of the
// host goes as in TestReboot (rebootHost). Started again, the daemon finds
// every executing run's unit gone (docs/daemon.md, "Restart"):
//
//   - an image run resumed from a snapshot is parked back at it, its last
//     interval journaling unit-lost, and resumes with the process state it
//     was parked with;
//   - an image run that never parked has no snapshot to go back to: it is
//     lost, and a close ends it;
//   - a transcript run is parked at the transcript it left, unaccounted,
//     and resumes from it.
//
// Every record verifies (closeAtEnd).
func TestPowerLoss(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := mustDaemon(t, "power-loss")
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	const resumed, fresh, thinking = "pl-resumed", "pl-fresh", "pl-thinking"
	startOracle(t, d, resumed, oracleImage)
	startOracle(t, d, fresh, oracleImage)
	p, atPark := park(t, d, resumed)
	resume(t, d, resumed, nil, atPark)
	// Every page in (a lazy resume): the unit is lost, not its pages.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if rs := mustShow(t, d, resumed).Restore; rs == nil || rs.ResidentNS > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the resumed run's pages were not all resident within a minute")
		}
	}
	trStart(t, d, thinking, trAgentImage, "STEPS=1", "WORK_ITERS=2000000000")
	waitSaidText(t, d, thinking, "step 1: thinking")

	cmd := d.cmd
	d.cmd = nil
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	rebootHost(t, d)
	mustStart(t, d)

	t.Run("ResumedImageRun", func(t *testing.T) {
		r, err := d.run(ctx, resumed)
		if err != nil || r.Phase != "parked" || r.Segments != 5 {
			t.Fatalf("after the power loss: %+v, %v; want parked back (5 segments)", r, err)
		}
		s := mustShow(t, d, resumed)
		if got, want := kinds(s.Segments), "executed suspended resumed executed suspended"; got != want {
			t.Fatalf("segments %s, want %s", got, want)
		}
		if s.Segments[4].Snapshot != p.Snapshot {
			t.Fatalf("parked back at %s, want the snapshot it resumed from, %s", s.Segments[4].Snapshot, p.Snapshot)
		}
		_, j := d.journal(t, s.Segments[3])
		var lost struct{ Reason string }
		if !lifecycleEntry(j, "unit-lost", &lost) || !strings.Contains(lost.Reason, "gone") {
			t.Fatalf("the lost interval's journal has no unit-lost entry (%+v)", lost)
		}
		// The stdout file holds the lost interval's lines too: the
		// resumed process goes on from the park's, as the same process.
		before := output(t, d.stdout(resumed))
		if _, err := d.c.Resume(ctx, resumed); err != nil {
			t.Fatal(err)
		}
		ls := waitLines(t, d.stdout(resumed), "a line verified after the resume", func(ls []line) bool {
			return len(ls) > len(before) && last(ls).VerifiedAt > atPark.Counter
		})
		checkOneProcess(t, append(ls[:atPark.Counter:atPark.Counter], ls[len(before):]...))
		if after := ls[len(before)]; after.Counter != atPark.Counter+1 || after.StartTime != atPark.StartTime {
			t.Fatalf("first line after the resume %+v; last before the park %+v", after, atPark)
		}
	})
	t.Run("FreshImageRun", func(t *testing.T) {
		r, err := d.run(ctx, fresh)
		if err != nil || r.Phase != "executing" || r.Status != "lost" {
			t.Fatalf("after the power loss: %+v, %v; want lost (it never parked)", r, err)
		}
		if c, err := d.c.Close(ctx, fresh, "lost with the host"); err != nil || c.Status != "closed" {
			t.Fatalf("close: %+v, %v", c, err)
		}
	})
	t.Run("TranscriptRun", func(t *testing.T) {
		r, err := d.run(ctx, thinking)
		if err != nil || r.Phase != "parked" || r.Segments != 2 {
			t.Fatalf("after the power loss: %+v, %v; want parked at its transcript (2 segments)", r, err)
		}
		s := mustShow(t, d, thinking)
		_, j := d.journal(t, s.Segments[0])
		if !lifecycleEntry(j, "unit-lost", nil) || !lifecycleEntry(j, "recovered", nil) {
			t.Fatal("the lost interval's journal lacks unit-lost or recovered")
		}
		if _, err := d.c.Resume(ctx, thinking); err != nil {
			t.Fatal(err)
		}
		trWait(t, d, thinking, "executing from its transcript", func(r api.Run) bool { return r.Phase == "executing" && r.Segments == 3 })
	})
}
