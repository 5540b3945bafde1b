//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// lazyDaemon is a daemon of t's own that resumes image parks lazily
// (serve --lazy-resume, docs/lazy-resume.md), with the oracle imported;
// t is skipped, naming the patch, where the daemon's CRIU cannot.
func lazyDaemon(t *testing.T, name string) *daemon {
	t.Helper()
	d := mustDaemon(t, name, func(d *daemon) { d.flags = []string{"--lazy-resume", "--criu-build", criuBuildFile()} })
	needsFastPath(t, d, "--lazy-resume")
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	return d
}

// waitRestore polls show until its live restore satisfies ok.
func waitRestore(t *testing.T, d *daemon, id, what string, ok func(*api.Restore) bool) api.Show {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := mustShow(t, d, id)
		if s.Restore != nil && ok(s.Restore) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: waiting for %s; show's restore %+v", id, what, s.Restore)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitResident waits until a lazily resumed run has every page in, so
// that a stop after it finds the lazy window closed. An eager resume's
// restore has no window: it returns at once.
func waitResident(t *testing.T, d *daemon, id string) {
	t.Helper()
	waitRestore(t, d, id, "every page resident", func(rs *api.Restore) bool { return !rs.Lazy || rs.ResidentNS > 0 })
}

// TestLazyResume parks the oracle on a daemon that resumes lazily and
// resumes it: resume answers once the unit runs (its restore says lazy,
// with its time to running), and the oracle goes on as the same process
// with its buffer's checksum recomputed over the restored memory. A park
// right away waits for every page: its dump holds the whole buffer, and
// show reads both times from the sealed interval's journal. Resumed
// lazily again, show reports the running unit's time to every page
// resident once lazy-pages is done; the record verifies from genesis.
func TestLazyResume(t *testing.T) {
	privileged(t)
	parallelFleet(t) // beside the crash tests (parallel_test.go)
	d := lazyDaemon(t, "lazy")
	const id = "lazy"
	startOracle(t, d, id, oracleImage)

	_, atPark := park(t, d, id)
	r := resume(t, d, id, nil, atPark)
	// (How many pages CRIU restored eagerly is its choice: nearly always
	// a few, once in a while all of them; docs/lazy-resume.md.)
	if rs := r.Restore; !rs.Lazy || rs.TotalNS <= 0 || rs.PagesLost != "" {
		t.Fatalf("resume: restore %+v, want a lazy one", rs)
	}
	// A park at once waits for every page if they are not all in yet:
	// its dump holds the whole buffer (park checks it), and the interval's
	// journal both times, where show reads them.
	p, atPark2 := park(t, d, id)
	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), "executed suspended resumed executed suspended"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	sealed := s.Segments[3].Restore
	if ex := s.Segments[3]; ex.Outcome != "parked" || sealed == nil || !sealed.Lazy || sealed.TotalNS != r.Restore.TotalNS ||
		sealed.ResidentNS <= sealed.MaterializeNS || s.Segments[4].Snapshot != p.Snapshot {
		t.Fatalf("the lazily resumed interval: %+v, restore %+v; the resume's %+v", ex, sealed, r.Restore)
	}
	if s.Segments[0].Restore != nil || s.Restore != nil {
		t.Fatalf("a restore on the started interval (%+v), or on a parked run (%+v)", s.Segments[0].Restore, s.Restore)
	}
	t.Logf("lazy resume: running after %v, every page resident after %v", time.Duration(sealed.TotalNS), time.Duration(sealed.ResidentNS))

	// Resumed lazily again, the running unit's show has both times once
	// every page is in.
	r = resume(t, d, id, nil, atPark2)
	s = waitRestore(t, d, id, "every page resident", func(rs *api.Restore) bool { return rs.ResidentNS > 0 })
	// Both times count from the restore's start; every page can be in
	// before the resume's last steps end (a small unit's background
	// transfer beat containerd's answer once, under load), not before
	// the images were laid out for lazy-pages to read.
	if live := s.Restore; !live.Lazy || live.TotalNS != r.Restore.TotalNS || live.ResidentNS <= live.MaterializeNS || live.PagesLost != "" {
		t.Fatalf("show's restore %+v; the resume's %+v", live, r.Restore)
	}
	if err := verifyRun(context.Background(), d, id); err != nil {
		t.Fatal(err)
	}
}

// lazyPages is the pid of the `criu lazy-pages` serving d's restore of
// run id, and how many userfaultfds it holds; 0 when there is none.
func lazyPages(d *daemon, id string) (pid, uffds int) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmd, []byte("lazy-pages\x00")) || !bytes.Contains(cmd, []byte(filepath.Join("criu", id, "restore"))) ||
			!bytes.Contains(cmd, []byte(d.root)) {
			continue
		}
		uffds, _ = uffdsHeld(n)
		return n, uffds
	}
	return 0, 0
}

// stopLazyPages stops (SIGSTOP) the lazy-pages of d's restore of run id
// once it holds want userfaultfds — every task's, before the unit runs:
// from then on no page reaches the unit — and sends its pid on found (0
// when there was none). (A lazy-pages stopped and continued fails:
// CRIU's poll takes the EINTR for an error.)
func stopLazyPages(d *daemon, id string, want int, found chan<- int) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		pid, _ := lazyPages(d, id)
		if pid == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		// Found (it listens before the restore starts): from now on only
		// its descriptors are looked at. A scan of every process each
		// time, under the load of the whole suite, once missed the
		// moment between its last userfaultfd and its last page.
		for time.Now().Before(deadline) {
			n, alive := uffdsHeld(pid)
			if !alive {
				break
			}
			if n >= want {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				found <- pid
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	found <- 0
}

// uffdsHeld is how many userfaultfds process pid holds, and whether it
// is still there.
func uffdsHeld(pid int) (n int, alive bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	fds, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	for _, fd := range fds {
		if l, _ := os.Readlink(filepath.Join(dir, fd.Name())); l == "anon_inode:[userfaultfd]" {
			n++
		}
	}
	return n, true
}

// startBigOracle starts the oracle with a 256 MiB buffer.
func startBigOracle(t *testing.T, d *daemon, id string) {
	t.Helper()
	if _, err := d.c.Start(context.Background(), api.RunRequest{ID: id, Unit: unit.Spec{Image: oracleImage, Env: []string{"SIZE_MB=256", "VERIFY_EVERY=5"}},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 512 << 20, Network: unit.NoNetwork}}); err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, d, id)
	waitLines(t, d.stdout(id), "the oracle's first verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt > 0 })
}

// resumeStopped resumes parked run id lazily with its lazy-pages stopped
// before the unit runs (stopLazyPages), and returns its pid.
func resumeStopped(t *testing.T, d *daemon, id string) int {
	t.Helper()
	found := make(chan int, 1)
	go stopLazyPages(d, id, 2, found)
	r, err := d.c.Resume(context.Background(), id)
	pid := <-found
	if pid == 0 {
		t.Fatalf("no lazy-pages with two userfaultfds for %s (resume: %v)", id, err)
	}
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if r.Restore == nil || !r.Restore.Lazy {
		t.Fatalf("resume: restore %+v, want a lazy one", r.Restore)
	}
	return pid
}

// TestLazyParkPagesLost parks a lazily resumed 256 MiB oracle whose
// pages cannot arrive (its lazy-pages stopped before the unit ran): the
// park waits for them — a dump now would leave the missing pages out —
// until the time to every page resident passes its deadline (the CRIU
// deadline, here 10 s); then it is refused pages_lost, lazy-pages is
// ended, and the run goes back to parked at the snapshot it resumed from,
// the record verifying.
func TestLazyParkPagesLost(t *testing.T) {
	privileged(t)
	parallelFleet(t) // beside the crash tests (parallel_test.go)
	d := mustDaemon(t, "lazy-deadline", func(d *daemon) { d.flags = []string{"--lazy-resume", "--criu-deadline", "10s"} })
	needsFastPath(t, d, "--lazy-resume")
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "lazy-deadline"
	startBigOracle(t, d, id)
	p, _ := park(t, d, id)
	pid := resumeStopped(t, d, id)
	_, err := d.c.Park(context.Background(), id)
	if ae := apiError(t, err, api.CodePagesLost); !strings.Contains(ae.Message, "restore deadline passed") {
		t.Fatalf("park of a unit whose pages cannot arrive: %v", ae)
	}
	s := waitParked(t, d, id)
	if got, want := kinds(s.Segments), "executed suspended resumed executed suspended"; got != want || s.Segments[4].Snapshot != p.Snapshot {
		t.Fatalf("segments %s (then %s), want %s back at %s", got, s.Segments[4].Snapshot, want, p.Snapshot)
	}
	if rs := s.Segments[3].Restore; rs == nil || !strings.Contains(rs.PagesLost, "restore deadline passed") {
		t.Fatalf("the lost interval's restore %+v", rs)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("lazy-pages %d still there after its deadline", pid)
	}
	if err := verifyRun(context.Background(), d, id); err != nil {
		t.Fatal(err)
	}
}

// waitParked waits until run id, whose pages were lost, is parked again,
// and returns show's view of it; a run closed instead fails the test.
func waitParked(t *testing.T, d *daemon, id string) api.Show {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		run, err := d.run(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case run.Phase == "parked":
			return mustShow(t, d, id)
		case run.Phase == "closed":
			s := mustShow(t, d, id)
			t.Fatalf("%s closed after its pages were lost: %s (%s)", id, kinds(s.Segments), s.Segments[len(s.Segments)-1].Reason)
		case time.Now().After(deadline):
			t.Fatalf("%s is %s a minute after its pages were lost", id, run.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLazyPagesLost kills lazy-pages while a 256 MiB oracle's pages are
// still arriving: the unit never reads a page that did not come (no line
// with a wrong checksum, ever), and the run goes back to parked at the
// snapshot it resumed from — the lost interval recorded, parked at that
// snapshot, its journal saying pages-lost, show saying why — and the
// record verifies. A park asked meanwhile is refused pages_lost. The next
// resume restores that snapshot again, and the oracle goes on from its
// park as the same process.
func TestLazyPagesLost(t *testing.T) {
	privileged(t)
	parallelFleet(t) // beside the crash tests (parallel_test.go)
	d := lazyDaemon(t, "lazy-lost")
	ctx := context.Background()
	const id = "lazy-lost"
	startBigOracle(t, d, id)
	p, atPark := park(t, d, id)

	// lazy-pages, stopped once it has both processes' userfaultfds, serves
	// nothing; killed once the resume has answered, it is gone mid-way.
	pid := resumeStopped(t, d, id)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A park now is refused: the unit's pages are lost (or, once the
	// daemon has parked it back, it is parked).
	_, err := d.c.Park(ctx, id)
	var ae *api.Error
	if !errors.As(err, &ae) || (ae.Code != api.CodePagesLost && ae.Code != api.CodePhase) ||
		(ae.Code == api.CodePagesLost && !strings.Contains(ae.Message, "lazy pages lost")) {
		t.Fatalf("a park after the loss: %v", err)
	}
	waitParked(t, d, id)
	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), "executed suspended resumed executed suspended"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	ex, back := s.Segments[3], s.Segments[4]
	if ex.Outcome != "parked" || back.Snapshot != p.Snapshot || back.Form != "image" {
		t.Fatalf("the lost interval %+v, then %+v; the park before it stored %s", ex, back, p.Snapshot)
	}
	if rs := ex.Restore; rs == nil || !rs.Lazy || rs.ResidentNS != 0 || !strings.Contains(rs.PagesLost, "lazy pages lost") ||
		!strings.Contains(rs.PagesLost, "killed") {
		t.Fatalf("the lost interval's restore %+v", ex.Restore)
	}
	_, j := d.journal(t, ex)
	var lost struct {
		AfterNS int64  `json:"after_ns"`
		Reason  string `json:"reason"`
	}
	if !lifecycleEntry(j, "pages-lost", &lost) || lost.AfterNS <= 0 || lifecycleEntry(j, "checkpointed", nil) {
		t.Fatalf("the lost interval's journal: pages-lost %+v; entries %s", lost, crashEvents(j))
	}
	if err := verifyRun(ctx, d, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("pages lost %v after the restore began: %s", time.Duration(lost.AfterNS), lost.Reason)

	// Not one line of the lost interval was computed on a missing page.
	ls := output(t, d.stdout(id))
	for i, l := range ls {
		if l.Checksum != ls[0].Checksum || l.Verify != ls[0].Checksum || l.StartTime != ls[0].StartTime {
			t.Fatalf("line %d %+v; first %+v", i, l, ls[0])
		}
	}
	// The next resume restores the snapshot again: the oracle goes on
	// from its park, as the same process.
	before := len(ls)
	if _, err := d.c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	ls = waitLines(t, d.stdout(id), "a line verified after the resume", func(ls []line) bool {
		return len(ls) > before && last(ls).VerifiedAt > atPark.Counter
	})
	after := ls[before]
	if after.Counter != atPark.Counter+1 || after.StartTime != atPark.StartTime || after.Pid != atPark.Pid || after.Checksum != atPark.Checksum {
		t.Fatalf("first line after the resume %+v; last before the park %+v", after, atPark)
	}
	if l := last(ls); l.Verify != atPark.Checksum {
		t.Fatalf("after the resume: %+v", l)
	}
}

// TestLazyRestartParksBack kills the daemon (SIGKILL) while a lazily
// resumed unit's pages are still arriving (its lazy-pages stopped: it
// holds the userfaultfds, so nothing reads a zero page). The restarted
// daemon cannot know what lazy-pages will do — it holds nothing to watch
// it by — so it finds the unfinished lazy restore and parks the run back
// at the snapshot it resumed from: the lost interval recorded, its journal
// saying pages-lost, the unit and lazy-pages gone, not one line computed
// on a missing page; the record verifies, and the next resume goes on from
// the park as the same process.
func TestLazyRestartParksBack(t *testing.T) {
	privileged(t)
	parallelFleet(t) // beside the crash tests (parallel_test.go)
	d := lazyDaemon(t, "lazy-restart")
	ctx := context.Background()
	const id = "lazy-restart"
	startBigOracle(t, d, id)
	p, atPark := park(t, d, id)
	pid := resumeStopped(t, d, id)
	_ = d.cmd.Process.Kill()
	<-d.done
	d.cmd = nil
	restarting := time.Now()
	mustStart(t, d)
	s := waitParked(t, d, id)
	t.Logf("parked back %v after the restart began", time.Since(restarting))
	if got, want := kinds(s.Segments), "executed suspended resumed executed suspended"; got != want || s.Segments[4].Snapshot != p.Snapshot {
		t.Fatalf("segments %s, want %s back at %s", got, want, p.Snapshot)
	}
	ex := s.Segments[3]
	if rs := ex.Restore; ex.Outcome != "parked" || rs == nil || !rs.Lazy || !strings.Contains(rs.PagesLost, "restarted") {
		t.Fatalf("the lost interval %+v, its restore %+v", ex, ex.Restore)
	}
	if _, j := d.journal(t, ex); lifecycleEntry(j, "checkpointed", nil) || !lifecycleEntry(j, "pages-lost", nil) {
		t.Fatalf("the lost interval's journal: %s", crashEvents(j))
	}
	// The sandbox is torn down behind the park back, lazy-pages with it.
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lazy-pages %d still there 30 s after the park back", pid)
		}
	}
	if err := verifyRun(ctx, d, id); err != nil {
		t.Fatal(err)
	}
	ls := output(t, d.stdout(id))
	for i, l := range ls {
		if l.Checksum != ls[0].Checksum || l.Verify != ls[0].Checksum || l.StartTime != ls[0].StartTime {
			t.Fatalf("line %d %+v; first %+v", i, l, ls[0])
		}
	}
	before := len(ls)
	if _, err := d.c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	ls = waitLines(t, d.stdout(id), "a line verified after the resume", func(ls []line) bool {
		return len(ls) > before && last(ls).VerifiedAt > atPark.Counter
	})
	if after := ls[before]; after.Counter != atPark.Counter+1 || after.StartTime != atPark.StartTime || after.Pid != atPark.Pid {
		t.Fatalf("first line after the resume %+v; last before the park %+v", after, atPark)
	}
}

// TestLazyHoldersKilled kills the daemon and then lazy-pages (SIGKILL
// both) while a lazily resumed unit's pages are still arriving (its
// lazy-pages stopped before the unit ran): no holder of the
// userfaultfds is left but the unit's own tasks
// (deploy/criu/8-restored-tasks-keep-uffds.patch), so the unit's faults
// wait and it computes nothing on a zero page while no daemon runs. The
// restarted daemon parks the run back at the snapshot it resumed from,
// the lost interval journaled; the record verifies, and the next resume
// goes on from the park as the same process.
func TestLazyHoldersKilled(t *testing.T) {
	privileged(t)
	parallelFleet(t) // beside the crash tests (parallel_test.go)
	d := lazyDaemon(t, "lazy-holders")
	ctx := context.Background()
	const id = "lazy-holders"
	startBigOracle(t, d, id)
	p, atPark := park(t, d, id)
	pid := resumeStopped(t, d, id)
	_ = d.cmd.Process.Kill()
	<-d.done
	d.cmd = nil
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Two of the oracle's verifications (VERIFY_EVERY=5, a tick every
	// 100 ms) with nothing serving its pages and no daemon.
	time.Sleep(2 * time.Second)
	ls := output(t, d.stdout(id))
	for i, l := range ls {
		if l.Checksum != ls[0].Checksum || l.Verify != ls[0].Checksum || l.StartTime != ls[0].StartTime {
			t.Fatalf("line %d %+v; first %+v", i, l, ls[0])
		}
	}
	mustStart(t, d)
	s := waitParked(t, d, id)
	if got, want := kinds(s.Segments), "executed suspended resumed executed suspended"; got != want || s.Segments[4].Snapshot != p.Snapshot {
		t.Fatalf("segments %s, want %s back at %s", got, want, p.Snapshot)
	}
	if ex := s.Segments[3]; ex.Outcome != "parked" || ex.Restore == nil || !strings.Contains(ex.Restore.PagesLost, "restarted") {
		t.Fatalf("the lost interval %+v, its restore %+v", ex, ex.Restore)
	}
	if err := verifyRun(ctx, d, id); err != nil {
		t.Fatal(err)
	}
	ls = output(t, d.stdout(id))
	for i, l := range ls {
		if l.Checksum != ls[0].Checksum || l.Verify != ls[0].Checksum || l.StartTime != ls[0].StartTime {
			t.Fatalf("line %d %+v; first %+v", i, l, ls[0])
		}
	}
	before := len(ls)
	if _, err := d.c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	ls = waitLines(t, d.stdout(id), "a line verified after the resume", func(ls []line) bool {
		return len(ls) > before && last(ls).VerifiedAt > atPark.Counter
	})
	if after := ls[before]; after.Counter != atPark.Counter+1 || after.StartTime != atPark.StartTime || after.Pid != atPark.Pid {
		t.Fatalf("first line after the resume %+v; last before the park %+v", after, atPark)
	}
}

// TestLazyCrashAtEachStep arms each failpoint of a lazy restore
// (failpoint.LazySteps) on a daemon that resumes lazily, and resumes the
// parked oracle there: the daemon dies at the step (at "lazy.restored"
// the unit runs and its sandbox's criu.conf still says lazy-pages). The
// daemon started again finds the run parked (Resumed was not durable),
// no sandbox and no lazy-pages of it; the next resume goes on from the
// park as the same process, and its next park is an ordinary dump that
// does not wait for a page server.
func TestLazyCrashAtEachStep(t *testing.T) {
	privileged(t)
	parallelFleet(t) // beside the crash tests (parallel_test.go)
	ctx := context.Background()
	for _, step := range failpoint.LazySteps {
		id := "lazy-crash-" + strings.ReplaceAll(step, ".", "-")
		// Armed from its start: nothing before the lazy restore reaches
		// the step.
		d := mustDaemon(t, id, func(d *daemon) {
			d.flags = []string{"--lazy-resume"}
			d.env = []string{failpoint.Env + "=" + step}
		})
		needsFastPath(t, d, "--lazy-resume")
		mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
		startOracle(t, d, id, oracleImage)
		_, atPark := park(t, d, id)
		if _, err := d.c.Resume(ctx, id); err == nil {
			t.Fatalf("the resume armed at %s answered", step)
		}
		crashKilled(t, d, step)
		d.env = nil
		mustStart(t, d)
		run, err := d.run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Phase != "parked" {
			t.Fatalf("after the crash at %s: %+v, want parked", step, run)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if pid, _ := lazyPages(d, id); pid == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the crash at %s: lazy-pages still there", step)
			}
		}
		// The stdout file may hold lines of the restore the crash
		// discarded (it ran until the restart destroyed it).
		before := output(t, d.stdout(id))
		r, err := d.c.Resume(ctx, id)
		if err != nil || r.Restore == nil || !r.Restore.Lazy {
			t.Fatalf("resume after the crash at %s: %v, restore %+v", step, err, r.Restore)
		}
		ls := waitLines(t, d.stdout(id), "a line verified after the resume", func(ls []line) bool {
			return len(ls) > len(before) && last(ls).VerifiedAt > atPark.Counter
		})
		checkOneProcess(t, append(ls[:atPark.Counter:atPark.Counter], ls[len(before):]...))
		start := time.Now()
		park(t, d, id)
		if took := time.Since(start); took > 30*time.Second {
			t.Fatalf("the park after the crash at %s took %v", step, took)
		}
		if err := verifyRun(ctx, d, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLazyCrashSettled arms each failpoint of a lazy restore's every page
// resident (failpoint.SettledSteps: lazy-pages exited cleanly and the unit
// is settled, nothing journaled) on a daemon at default flags, and
// resumes the parked oracle there: the daemon dies once every page is
// in. The daemon started again reattaches the unit, which goes on as the
// same process, and journals its interval's resident entry from what the
// dead daemon left (pageserver.Pids.Settled): show says when every page
// was in, and so does the journal of the next park.
func TestLazyCrashSettled(t *testing.T) {
	privileged(t)
	parallelFleet(t) // beside the crash tests (parallel_test.go)
	ctx := context.Background()
	for _, step := range failpoint.SettledSteps {
		id := "lazy-settled-" + strings.ReplaceAll(step, ".", "-")
		d := mustDaemon(t, id, func(d *daemon) {
			d.env = []string{failpoint.Env + "=" + step}
		})
		needsFastPath(t, d, "--lazy-resume")
		mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
		startOracle(t, d, id, oracleImage)
		_, atPark := park(t, d, id)
		// The resume may answer before the daemon dies, or not.
		_, _ = d.c.Resume(ctx, id)
		crashKilled(t, d, step)
		d.env = nil
		mustStart(t, d)
		run, err := d.run(ctx, id)
		if err != nil || run.Phase != "executing" || run.Status != "running" {
			t.Fatalf("after the crash at %s: %+v, %v; want it running (reattached)", step, run, err)
		}
		rs := mustShow(t, d, id).Restore
		if rs == nil || !rs.Lazy || rs.ResidentNS <= 0 || rs.PagesLost != "" {
			t.Fatalf("after the crash at %s: restore %+v, want every page resident, as the dead daemon saw it", step, rs)
		}
		ls := waitLines(t, d.stdout(id), "a line verified after the restart", func(ls []line) bool {
			return len(ls) > 0 && last(ls).VerifiedAt > atPark.Counter
		})
		checkOneProcess(t, ls)
		park(t, d, id)
		segs := mustShow(t, d, id).Segments
		if got := segs[len(segs)-2].Restore; got == nil || got.ResidentNS != rs.ResidentNS {
			t.Fatalf("the parked interval's restore %+v, want resident after %d ns", got, rs.ResidentNS)
		}
		t.Logf("%s: every page resident %v after the restore began", step, time.Duration(rs.ResidentNS))
		if err := verifyRun(ctx, d, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLazyCrowded resumes at once one oracle more than the daemon has
// dump and restore slots (imageparks.Slots: GOMAXPROCS, at least 2), on a
// daemon that resumes lazily: the last admitted finds the slots crowded
// and restores eagerly (docs/lazy-resume.md, "Resume"). Lazy or eager,
// each oracle goes on as the same process, its buffer intact.
func TestLazyCrowded(t *testing.T) {
	privileged(t)
	parallelFleet(t)
	d := lazyDaemon(t, "crowded")
	n := max(2, runtime.NumCPU()) + 1
	atPark := make([]line, n)
	id := func(i int) string { return "crowded-" + strconv.Itoa(i) }
	for i := range n {
		startOracle(t, d, id(i), oracleImage)
		_, atPark[i] = park(t, d, id(i))
	}
	type result struct {
		r   api.Resume
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := d.c.Resume(context.Background(), id(i))
			results[i] = result{r, err}
		})
	}
	wg.Wait()
	eager := 0
	for i, res := range results {
		if res.err != nil {
			t.Fatalf("resume %s: %v", id(i), res.err)
		}
		resumed(t, d, id(i), res.r, nil, atPark[i])
		if !res.r.Restore.Lazy {
			eager++
		}
		waitResident(t, d, id(i))
	}
	if eager == 0 {
		t.Fatalf("%d resumes at once, every one lazy", n)
	}
	t.Logf("%d resumes at once: %d eager, %d lazy", n, eager, n-eager)
}
