//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	// the e2e daemon type is daemon
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// crashLeaves is what docs/daemon.md ("Ordering: what a crash at each step
// leaves", "Restart") says a crash at each failpoint leaves, as the daemon
// started again after it reports the run.
var crashLeaves = map[string]struct {
	phase, status string
	kinds         string // the record's segments
	sandbox       bool   // the run's sandbox is there, reattached
}{
	// The sandbox is up but the run's genesis is not stored: no run, and
	// the orphan sandbox is destroyed (crashAtStart checks it).
	"start.sandboxed": {},
	// Before the park's segments are durable the record is unchanged; the
	// frozen unit is thawed and goes on.
	"park.checkpointed": {"executing", "running", "", true},
	"park.attested":     {"executing", "running", "", true},
	// After them, the sandbox of a parked run is destroyed.
	"park.appended": {"parked", "parked (image)", "executed suspended", false},
	// A restored sandbox beside a parked record is destroyed: still parked.
	"resume.restored": {"parked", "parked (image)", "executed suspended", false},
	// Resumed is durable and its sandbox there: reattached.
	"resume.appended": {"executing", "running", "executed suspended resumed", true},
	// A closed run's sandbox is destroyed.
	"close.appended": {"closed", "closed", "executed closed", false},
}

// crashDown is the least time a crashed daemon stays down, so that a unit
// left running would be seen writing (the oracle writes every 100 ms) and a
// frozen one seen not to.
const crashDown = 500 * time.Millisecond

// TestCrashAtEachStep arms each failpoint of failpoint.Steps in turn on
// one state directory, drives a run of the oracle to that step, and checks
// that the daemon died there by SIGKILL, that the store it left passes
// fsck with the run in the phase the documented ordering gives, that the
// daemon started again finds the same, keeps or destroys the sandbox as
// documented, and that the run then goes on to a normal end as the same
// process, leaving no sandbox behind.
func TestCrashAtEachStep(t *testing.T) {
	privileged(t)
	parallelCrash(t) // parallel_test.go
	for _, step := range failpoint.Steps {
		if _, ok := crashLeaves[step]; !ok {
			t.Fatalf("failpoint %s: the crash test does not know what it leaves; add it to crashLeaves", step)
		}
	}
	// The steps of an eager resume (a lazy one's: lazy_test.go).
	d := mustDaemon(t, "crash", func(d *daemon) { d.flags = []string{"--lazy-resume=false"} })
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	scratch := t.TempDir()
	for _, step := range failpoint.Steps {
		if step == "start.sandboxed" {
			t.Run(step, func(t *testing.T) { crashAtStart(t, d, step, scratch) })
			continue
		}
		t.Run(step, func(t *testing.T) { crashAt(t, d, step, scratch) })
	}
}

// crashAtStart is the start's subtest: the daemon dies with the unit's
// sandbox up and no run stored. Started again, it has no such run and has
// destroyed the orphan sandbox, and the same id starts afresh.
func crashAtStart(t *testing.T, d *daemon, step, scratch string) {
	ctx := context.Background()
	id := "crash-" + step
	if d.running() {
		mustStop(t, d)
	}
	d.env = []string{failpoint.Env + "=" + step}
	err := d.start()
	d.env = nil
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.c.Start(ctx, api.RunRequest{ID: id,
		Unit:   unit.Spec{Image: oracleImage, Env: oracleEnv},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork}})
	var ae *api.Error
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("the start that reaches %s answered (%v); want the connection dropped", step, err)
	}
	crashKilled(t, d, step)
	if _, ok := crashFsck(t, d)[id]; ok {
		t.Fatalf("the crash at %s left run %s stored; want none", step, id)
	}
	mustStart(t, d)
	_, err = d.c.Show(ctx, id)
	apiError(t, err, api.CodeNotFound)
	if sbs := crashSandboxes(t, d, scratch); len(sbs) != 0 {
		t.Fatalf("after the crash at %s and a restart, sandboxes %q; want none", step, sbs)
	}
	startOracle(t, d, id, oracleImage)
	if _, err := d.c.Close(ctx, id, "e2e: crash test over"); err != nil {
		t.Fatal(err)
	}
	mustStop(t, d)
}

// crashAt is one failpoint's subtest. It leaves the daemon stopped.
func crashAt(t *testing.T, d *daemon, step, scratch string) {
	ctx := context.Background()
	want := crashLeaves[step]
	id := "crash-" + step
	if d.running() {
		mustStop(t, d)
	}
	d.env = []string{failpoint.Env + "=" + step}
	err := d.start()
	d.env = nil
	if err != nil {
		t.Fatal(err)
	}
	startOracle(t, d, id, oracleImage)

	// Drive the run to the step; the daemon dies there, dropping the
	// connection.
	var atPark line
	switch {
	case strings.HasPrefix(step, "park."):
		_, err = d.c.Park(ctx, id)
	case strings.HasPrefix(step, "resume."):
		_, atPark = park(t, d, id)
		_, err = d.c.Resume(ctx, id)
	case strings.HasPrefix(step, "close."):
		_, err = d.c.Close(ctx, id, "e2e: crash at "+step)
	default:
		t.Fatalf("failpoint %s: no operation reaches it", step)
	}
	var ae *api.Error
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("the operation that reaches %s answered (%v); want the connection dropped", step, err)
	}
	crashKilled(t, d, step)
	crashed := time.Now()

	// The store as the crash left it: it passes fsck, and the run is
	// where the ordering says, before any reconcile.
	st := crashFsck(t, d)
	r, ok := st[id]
	if !ok || r.Phase.String() != want.phase || r.Len != len(strings.Fields(want.kinds)) {
		t.Fatalf("the crash at %s left run %s %+v (stored: %v), want %s with segments %q", step, id, r, ok, want.phase, want.kinds)
	}
	time.Sleep(time.Until(crashed.Add(crashDown)))

	// Started again, unarmed, the daemon finds the same and has made the
	// sandboxes agree with it.
	restarting := time.Now()
	mustStart(t, d)
	started := time.Now() // reconciled
	if err := verifyRun(ctx, d, id); err != nil {
		t.Fatal(err)
	}
	sum, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	s := mustShow(t, d, id)
	if sum.Phase != want.phase || sum.Status != want.status || sum.Head != r.Head.String() || kinds(s.Segments) != want.kinds {
		t.Fatalf("after the crash at %s and a restart: %+v, segments %q; want %s, %s, segments %q, head %s as the crash left it",
			step, sum, kinds(s.Segments), want.phase, want.status, want.kinds, r.Head)
	}
	var wantSBs []string // every earlier run is closed
	if want.sandbox {
		wantSBs = []string{id}
	}
	if sbs := crashSandboxes(t, d, scratch); !slices.Equal(sbs, wantSBs) {
		t.Fatalf("after the crash at %s and a restart, sandboxes %q; want %q", step, sbs, wantSBs)
	}

	// The unit and the run after it.
	final := "executed suspended resumed executed closed"
	var discarded []byte // output of a restore the crash discarded
	switch step {
	case "park.checkpointed", "park.attested":
		// The park froze the unit; the restart thawed it, and it goes on
		// as the same process.
		ls := waitLines(t, d.stdout(id), "a line written after the restart", func(ls []line) bool {
			return len(ls) > 0 && last(ls).Time > started.UnixNano()
		})
		checkOneProcess(t, ls)
		crashFrozen(t, ls, crashed, restarting)
		_, atPark = park(t, d, id)
		resume(t, d, id, nil, atPark)
	case "park.appended":
		// Parked, its sandbox destroyed frozen: it wrote nothing after
		// the park, and resumes from it.
		ls := output(t, d.stdout(id))
		checkOneProcess(t, ls)
		if l := last(ls); l.Time > crashed.UnixNano() {
			t.Fatalf("the unit of a run parked by the crashed daemon wrote a line after the crash: %+v", l)
		}
		resume(t, d, id, nil, last(ls))
	case "resume.restored":
		discarded = crashResumeAgain(t, d, id, atPark)
	case "resume.appended":
		// Reattached to the restored unit: one process all along.
		ls := waitLines(t, d.stdout(id), "a line written after the restart", func(ls []line) bool {
			return len(ls) > 0 && last(ls).Time > started.UnixNano()
		})
		checkOneProcess(t, ls)
		if ls[atPark.Counter-1] != atPark {
			t.Fatalf("line %d is %+v; at the park it was %+v", atPark.Counter, ls[atPark.Counter-1], atPark)
		}
		_, atPark = park(t, d, id)
		resume(t, d, id, nil, atPark)
		final = "executed suspended resumed executed suspended resumed executed closed"
	case "close.appended":
		// Closed for good.
		_, err := d.c.Close(ctx, id, "e2e: again")
		apiError(t, err, api.CodePhase)
		_, err = d.c.Resume(ctx, id)
		apiError(t, err, api.CodePhase)
		final = "executed closed"
	default:
		t.Fatalf("failpoint %s: no checks after it", step)
	}

	// A normal end: closed, verified, nothing left running.
	if sum, err := d.run(ctx, id); err != nil || sum.Phase != "closed" {
		if _, err := d.c.Close(ctx, id, "e2e: crash test over"); err != nil {
			t.Fatalf("close %s: %v", id, err)
		}
	}
	if err := verifyRun(ctx, d, id); err != nil {
		t.Fatal(err)
	}
	if s := mustShow(t, d, id); kinds(s.Segments) != final || s.Run.Status != "closed" {
		t.Fatalf("run %s ends %s with segments %q; want closed with %q", id, s.Run.Status, kinds(s.Segments), final)
	}
	// Each interval is attested whole across the crash: its journal holds
	// the output from the end of the one before (the only output in none
	// is a discarded restore's), from before its first line, with the
	// lifecycle entries of its park and of the resume that began it.
	t.Run("IntervalsSpanCrash", func(t *testing.T) {
		for i, gap := range crashJournals(t, d, id) {
			if i == 1 && discarded != nil {
				if !bytes.Equal(gap, discarded) {
					t.Errorf("between intervals 1 and 2: %d bytes in no journal, want the %d of the discarded restore: %s",
						len(gap), len(discarded), crashHead(gap))
				}
				continue
			}
			if len(gap) > 0 {
				t.Errorf("output before interval %d in no interval's journal: %d bytes, %s", i+1, len(gap), crashHead(gap))
			}
		}
	})
	if err := d.verifyAll(ctx); err != nil {
		t.Fatal(err)
	}
	if sbs := crashSandboxes(t, d, scratch); len(sbs) > 0 {
		t.Fatalf("every run is closed, but sandboxes are left: %q", sbs)
	}
	crashNoShim(t, d, id)
	runs, err := d.c.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	mustStop(t, d)
	if st := crashFsck(t, d); len(st) != len(runs) || st[id].Phase.String() != "closed" {
		t.Fatalf("stopped, the store holds %d runs (%s %s); the daemon listed %d", len(st), id, st[id].Phase, len(runs))
	}
}

// crashKilled waits for the armed daemon to die, and checks that it was
// SIGKILL at the failpoint.
func crashKilled(t *testing.T, d *daemon, step string) {
	t.Helper()
	select {
	case err := <-d.done:
		d.cmd = nil
		var ee *exec.ExitError
		ws, ok := syscall.WaitStatus(0), false
		if errors.As(err, &ee) {
			ws, ok = ee.Sys().(syscall.WaitStatus)
		}
		if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("the daemon armed at %s ended with %v, want killed by SIGKILL; log %s:\n%s", step, err, d.log, d.logTail())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon armed at %s is still running 30 s after the operation failed; log %s:\n%s", step, d.log, d.logTail())
	}
}

// crashFsck opens the stopped daemon's store, checks it (store.Check:
// every record verifies from genesis, every object it reaches rehashes)
// and returns its runs.
func crashFsck(t *testing.T, d *daemon) map[string]store.Run {
	t.Helper()
	if d.running() {
		t.Fatal("crashFsck with the daemon running")
	}
	st, err := store.Open(filepath.Join(d.state, "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	}()
	cs, err := st.Check(context.Background())
	if err != nil {
		t.Fatalf("fsck: %v", err)
	}
	ids, err := st.AllRuns()
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]store.Run{}
	for _, id := range ids {
		if runs[id], err = st.Run(id); err != nil {
			t.Fatal(err)
		}
	}
	if cs.Runs != len(runs) {
		t.Fatalf("fsck checked %d runs of %d", cs.Runs, len(runs))
	}
	t.Logf("fsck: %d runs, %d segments, %d objects (%d B) verified", cs.Runs, cs.Segments, cs.Objects, cs.Bytes)
	return runs
}

// crashSandboxes lists the sandboxes in the daemon's containerd, asking
// containerd itself.
func crashSandboxes(t *testing.T, d *daemon, scratch string) []string {
	t.Helper()
	ctx := context.Background()
	h, err := d.c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := executor.Connect(ctx, executor.Config{Address: h.Containerd, StateDir: scratch})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	ids, err := ex.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

// crashNoShim waits briefly for the shim of run id's sandbox to be gone.
func crashNoShim(t *testing.T, d *daemon, id string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var left []string
		for _, p := range d.processes() {
			if strings.Contains(p+" ", " -id "+id+" ") {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is closed, but its shim is left: %s", id, strings.Join(left, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// crashFrozen checks that the unit wrote nothing while no daemon ran: the
// crashed park had frozen it.
func crashFrozen(t *testing.T, ls []line, crashed, restarting time.Time) {
	t.Helper()
	for _, l := range ls {
		if l.Time > crashed.UnixNano() && l.Time < restarting.UnixNano() {
			t.Fatalf("the unit wrote %+v while no daemon ran (%v to %v): the crashed park had not left it frozen",
				l, crashed.Format(time.StampMicro), restarting.Format(time.StampMicro))
		}
	}
}

// crashResumeAgain resumes a run whose first resume crashed after its
// restore, and closes it. The restored incarnation ran until the restarted
// daemon destroyed it, so the stdout file may hold its lines after the
// park's; the resume must go on from the park all the same. It returns the
// discarded incarnation's output.
func crashResumeAgain(t *testing.T, d *daemon, id string, atPark line) []byte {
	t.Helper()
	data, err := os.ReadFile(d.stdout(id))
	if err != nil {
		t.Fatal(err)
	}
	before := output(t, d.stdout(id))
	if len(before) < int(atPark.Counter) || before[atPark.Counter-1] != atPark {
		t.Fatalf("%d lines; at the park the last was %+v", len(before), atPark)
	}
	// The discarded incarnation, too, went on from the park.
	checkOneProcess(t, before)
	end := 0 // of the park's last line
	for range atPark.Counter {
		end += bytes.IndexByte(data[end:], '\n') + 1
	}
	t.Logf("stdout holds %d lines (%d B) of the restore the crash discarded", len(before)-int(atPark.Counter), len(data)-end)

	r, err := d.c.Resume(context.Background(), id)
	if err != nil {
		t.Fatalf("resume %s: %v", id, err)
	}
	if r.Run.Phase != "executing" || r.Run.Status != "running" || r.Restore == nil || r.Idle.UJ == 0 {
		t.Fatalf("resumed %+v, restore %+v, idle %+v", r.Run, r.Restore, r.Idle)
	}
	ls := waitLines(t, d.stdout(id), "a line verified after the resume", func(ls []line) bool {
		return len(ls) > len(before) && last(ls).VerifiedAt > atPark.Counter
	})
	// One process from the start through the park and this resume, the
	// discarded branch left out.
	checkOneProcess(t, append(ls[:atPark.Counter:atPark.Counter], ls[len(before):]...))
	if _, err := d.c.Close(context.Background(), id, "e2e: crash test over"); err != nil {
		t.Fatal(err)
	}
	return data[end:]
}

// crashJournals checks each interval of run id against the stdout file:
// its journal holds a run of the file after the previous interval's,
// attested from before the first line in it, with a checkpointed entry if
// it parked and restored and idle entries if a resume began it. It returns,
// per interval, the output between the previous interval's journal and its
// own.
func crashJournals(t *testing.T, d *daemon, id string) [][]byte {
	t.Helper()
	s := mustShow(t, d, id)
	out, err := os.ReadFile(d.stdout(id))
	if err != nil {
		t.Fatal(err)
	}
	var gaps [][]byte
	off, resumed := 0, false
	var prevEnd int64
	for _, seg := range s.Segments {
		if seg.Kind == "resumed" {
			resumed = true
		}
		if seg.Kind != "executed" {
			continue
		}
		n := len(gaps) + 1
		body, j := d.journal(t, seg)
		got := stdoutOf(j)
		at := bytes.Index(out[off:], got)
		if len(got) == 0 || at < 0 {
			t.Errorf("interval %d (journal: %s): journal holds %d bytes of stdout, not a run of the file after offset %d",
				n, crashEvents(j), len(got), off)
			return gaps
		}
		gaps = append(gaps, out[off:off+at])
		off += at + len(got)
		first, _, _ := bytes.Cut(got, []byte("\n"))
		var l line
		if err := json.Unmarshal(first, &l); err != nil {
			t.Fatalf("interval %d: journal's first line %q: %v", n, first, err)
		}
		if !stampedWithin(l.Time, body.StartNS, prevEnd) {
			t.Errorf("interval %d (journal: %s) is attested from %v, but its journal holds a line written at %v",
				n, crashEvents(j), time.Unix(0, body.StartNS).UTC().Format(time.StampMicro), time.Unix(0, l.Time).UTC().Format(time.StampMicro))
		}
		if seg.Outcome == "parked" && !lifecycleEntry(j, "checkpointed", nil) {
			t.Errorf("interval %d (journal: %s) parked, but its journal has no checkpointed entry", n, crashEvents(j))
		}
		if resumed && !(lifecycleEntry(j, "restored", nil) && lifecycleEntry(j, "idle", nil)) {
			t.Errorf("interval %d (journal: %s) began with a resume, but its journal lacks the restored or the idle entry", n, crashEvents(j))
		}
		resumed = false
		prevEnd = body.EndNS
	}
	return gaps
}

// stampedWithin says whether a line stamped at stamp may open an interval
// attested from start, the interval before it (if any) ending at prevEnd.
// The oracle stamps a line, then writes it: a park's freeze can fall
// between the two, and the line then reaches the output when the resume
// thaws the unit, in the next interval, stamped before the park ended the
// one before.
func stampedWithin(stamp, start, prevEnd int64) bool {
	return stamp >= start || (prevEnd > 0 && stamp <= prevEnd)
}

// crashEvents lists a journal's lifecycle events, for a message.
func crashEvents(j *attest.Journal) string {
	var ev []string
	for _, e := range j.Entries {
		if e.Kind == attest.Lifecycle {
			name, _, _ := bytes.Cut(e.Data, []byte(" {"))
			ev = append(ev, fmt.Sprintf("%q", name))
		}
	}
	return strings.Join(ev, ", ")
}

func crashHead(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return fmt.Sprintf("%q", b)
}
