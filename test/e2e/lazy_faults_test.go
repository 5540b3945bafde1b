//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

var (
	lazyFaultsRounds = flag.Int("lazyfaults", 1, "rounds of TestLazyFaults' cases (each round: every case once, at new random points)")
	lazyFaultsSeed   = flag.Uint64("lazyfaults-seed", 0, "TestLazyFaults' seed (0: from the clock); a failure logs the one it ran with")
	lazyFaultsOnly   = flag.String("lazyfaults-only", "", "run only TestLazyFaults' cases whose name holds this")
)

// restartBound bounds how long a daemon restarted in TestLazyFaults
// takes to answer: the freeze of a unit whose lazy restore it found
// unfinished (5 s at most, when a thread waits on a page no one serves:
// daemon.unfinishedFreeze), then destroyed, plus a start under the
// suite's load (its containerd alone took 5 s once in CI). A restore's
// CRIU deadline (minutes) is what it tells apart.
const restartBound = 15 * time.Second

// faultsBuffer is the size of TestLazyFaults' oracle's buffer.
const faultsBuffer = 128 << 20

// victims is what a case of TestLazyFaults kills in the lazy window.
type victims struct{ lazyPages, server, daemon bool }

func (v victims) String() string {
	var s []string
	for _, k := range []struct {
		on   bool
		name string
	}{{v.lazyPages, "lazy-pages"}, {v.server, "page-server"}, {v.daemon, "daemon"}} {
		if k.on {
			s = append(s, k.name)
		}
	}
	return strings.Join(s, "+")
}

// faultCase is one case of TestLazyFaults: what is killed; whether as
// soon as lazy-pages holds every task's userfaultfd (early: the restore
// may not have returned); whether the unit forks just before (within a
// few ms); whether the records of the lazy restore's pids name other,
// live processes when the daemon restarts (a reused pid); whether in the
// restore, as soon as lazy-pages holds a first userfaultfd (restoring).
// With failpoint, nothing is killed: the daemon is armed at that step.
// With lostAt, the daemon is armed at that step of failpoint.LostSteps
// and dies there by itself, once v's death lost the pages; unfrozen arms
// the lazy.freeze fault beside it (the freeze for the lost pages fails).
type faultCase struct {
	v                                        victims
	early, fork, reused, restoring, unfrozen bool
	failpoint, lostAt                        string
}

// daemonDies is whether the daemon dies in c: killed, or at c.lostAt.
func (c faultCase) daemonDies() bool { return c.v.daemon || c.lostAt != "" }

func (c faultCase) String() string {
	if c.failpoint != "" {
		return "daemon crashed at " + c.failpoint
	}
	s := c.v.String()
	if s == "" {
		s = "nothing killed"
	}
	if c.lostAt != "" {
		s += ", daemon crashed at " + c.lostAt
	}
	if c.unfrozen {
		s += ", the freeze failing"
	}
	if c.early {
		s = "early " + s
	}
	if c.restoring {
		s = "restoring, " + s
	}
	if c.fork {
		s = "fork, then " + s
	}
	if c.reused {
		s += ", pids reused"
	}
	return s
}

// lazyFaultCases: each of the three holders alone, each pair, all three;
// a fork before a kill of random victims; a restart whose recorded pids
// name other processes; the daemon killed in the restore.
func lazyFaultCases(rng *rand.Rand) []faultCase {
	sets := []victims{
		{lazyPages: true}, {server: true}, {daemon: true},
		{lazyPages: true, server: true}, {lazyPages: true, daemon: true}, {server: true, daemon: true},
		{lazyPages: true, server: true, daemon: true},
	}
	cs := make([]faultCase, 0, len(sets)+4)
	for _, v := range sets {
		cs = append(cs, faultCase{v: v})
	}
	for _, step := range failpoint.LazySteps {
		cs = append(cs, faultCase{failpoint: step})
	}
	for _, step := range failpoint.LostSteps {
		cs = append(cs, faultCase{v: victims{server: true}, lostAt: step},
			faultCase{v: victims{server: true}, lostAt: step, unfrozen: true})
	}
	cs = append(cs,
		faultCase{v: sets[rng.IntN(len(sets))], early: true},
		faultCase{v: victims{lazyPages: true, server: true, daemon: true}, reused: true},
		faultCase{v: victims{lazyPages: true, daemon: true}, restoring: true},
		faultCase{v: victims{lazyPages: true, server: true, daemon: true}, restoring: true})
	rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
	// Last: a forked copy stays in the unit (and its parks) for good.
	cs = append(cs, faultCase{fork: true}, faultCase{v: sets[rng.IntN(len(sets))], fork: true})
	return slices.DeleteFunc(cs, func(c faultCase) bool { return !strings.Contains(c.String(), *lazyFaultsOnly) })
}

// TestLazyFaults is the fault-injection matrix of a served lazy resume
// (serve --lazy-resume --lazy-served --chunked-images,
// docs/lazy-resume.md). A 128 MiB oracle is resumed and, at a random
// point of its lazy window (a random share of its buffer resident, or as
// soon as lazy-pages holds the userfaultfds: the restore may not have
// returned), lazy-pages, the page server, the daemon, each pair of them
// or all three are SIGKILLed. Besides: the unit forks a few ms before
// random victims die, or with none (then the forked copy's buffer must
// be the oracle's, byte for byte, once every page is in); the restarted
// daemon finds the recorded pids taken by other, live processes (a
// reused pid); the daemon and lazy-pages die in the restore, the
// restarted daemon answering within restartBound all the same; the daemon
// dies at each of failpoint.LazySteps (the unit runs, criu.conf not yet
// repaired).
//
// Whatever dies, the oracle never computes a line on a page that is not
// its own (each line's recomputed checksum is its buffer's). It goes on
// (a park succeeds; its image holds the whole buffer, which the next
// resume verifies); or the restore fails and the run stays parked; or it
// goes back to the snapshot it resumed from, the interval journaled
// pages-lost. The record verifies every time; nothing of a failed or lost
// interval is left running (lazy-pages, page server, unit), and a process
// holding a reused pid is not killed. The seed is logged: `-args
// -lazyfaults=N -lazyfaults-seed=S -lazyfaults-only=SUBSTRING` runs N
// rounds, replays one, or some cases.
func TestLazyFaults(t *testing.T) {
	privileged(t)
	parallelFleet(t) // beside the crash tests (parallel_test.go)
	d := mustDaemon(t, "lazy-faults", func(d *daemon) {
		d.flags = []string{"--lazy-resume", "--lazy-served", "--chunked-images", "--criu-build", criuBuildFile()}
	})
	needsFastPath(t, d, "--lazy-resume")
	needsFastPath(t, d, "--lazy-served")
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	seed := *lazyFaultsSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -run 'TestLazyFaults$' ./test/e2e/ -args -lazyfaults-seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	const id = "lazy-faults"
	ctx := context.Background()
	// Each round's fork that goes on leaves a copy of the buffer in the
	// unit, every page of it served again by the next lazy restores: the
	// grant makes room for them and the next fork.
	grant := uint64(*lazyFaultsRounds+3) * (faultsBuffer + 64<<20)
	env := []string{fmt.Sprintf("SIZE_MB=%d", faultsBuffer>>20), "VERIFY_EVERY=5", "FORK_ON_USR2=1"}
	if _, err := d.c.Start(ctx, api.RunRequest{ID: id, Unit: unit.Spec{Image: oracleImage, Env: env},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: grant, Network: unit.NoNetwork}}); err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, d, id)
	first := waitLines(t, d.stdout(id), "the oracle's first verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt > 0 })[0]
	p, atPark := park(t, d, id)
	f := faults{t: t, d: d, id: id, first: first, snap: p.Snapshot, atPark: atPark}
	for round := range *lazyFaultsRounds {
		for _, c := range lazyFaultCases(rng) {
			start := time.Now()
			f.run(c, rng)
			t.Logf("round %d, %s: %v", round, c, time.Since(start).Round(time.Millisecond))
		}
	}
}

// faults is TestLazyFaults' run: its oracle's first line, and the
// snapshot it is parked at and the last line before that park.
type faults struct {
	t      *testing.T
	d      *daemon
	id     string
	first  line
	snap   string
	atPark line
	decoys []*exec.Cmd // reusePids'
}

// struck is what killAt did: the processes of the lazy restore it found;
// whether it struck (else every page came first), the share of the
// buffer resident then, and whether lazy-pages was still alive; the time
// from the fork to the kill.
type struck struct {
	lazyPages, server int
	work              string
	resident          float64
	fired, open       bool
	forked            time.Duration // from the fork to the kill
	segs              int           // the run's segments before the resume
	spread            time.Duration // between two kills
	oracle            int           // with a fork, the oracle's host pid
	children          []int         // and its children before it forked
}

// run resumes the parked oracle and kills c's victims at a random point
// of the lazy window (retrying at an earlier point, up to three times,
// when every page was in first), then checks the outcome.
func (f *faults) run(c faultCase, rng *rand.Rand) {
	t := f.t
	if c.failpoint != "" {
		f.crashAt(c)
		return
	}
	if c.lostAt != "" {
		mustStop(t, f.d)
		arm := c.lostAt
		if c.unfrozen {
			arm = "lazy.freeze," + arm
		}
		f.d.env = []string{failpoint.Env + "=" + arm}
		mustStart(t, f.d)
	}
	share := 0.6 * rng.Float64()
	if c.early || c.restoring {
		share = 0
	}
	if (c.reused || c.lostAt != "") && share < 0.05 {
		// The unit runs: the restarted daemon parks it back (a restore
		// that failed instead would not reach lostAt).
		share += 0.05
	}
	for try := 0; ; try++ {
		k := f.strike(c, share, rng)
		if k.fired {
			t.Logf("%s: struck at %.1f%% of the buffer resident (%.1f%% drawn), lazy-pages then alive: %v; lazy-pages %d, page server %d; kills %v apart",
				c, 100*k.resident, 100*share, k.open, k.lazyPages, k.server, k.spread)
			f.settle(c, k)
			return
		}
		if try == 2 {
			t.Fatalf("%s: every page was in before %.1f%% of the buffer was seen resident, three times", c, 100*share)
		}
		// Went on, every page in: a park for the next try.
		t.Logf("%s: every page in before %.1f%% was seen resident: again, earlier", c, 100*share)
		f.checkLines(c)
		p, atPark := park(t, f.d, f.id)
		f.snap, f.atPark = p.Snapshot, atPark
		share /= 4
	}
}

// strike resumes the oracle and kills c's victims once share of its
// buffer is resident, lazy-pages holding every task's userfaultfd.
func (f *faults) strike(c faultCase, share float64, rng *rand.Rand) struck {
	t, d := f.t, f.d
	pt := point{share: share, fork: time.Duration(rng.IntN(5000)) * time.Microsecond, order: rng.Perm(3)}
	if rng.IntN(2) == 1 {
		// The daemon may die while it handles an earlier victim's death.
		pt.spread = time.Duration(rng.IntN(300)) * time.Millisecond
	}
	if c.reused {
		// The daemon first: it must not see the others die.
		pt.order, pt.spread = []int{2, 0, 1}, 0
	}
	found := make(chan struct {
		k   struck
		err error
	}, 1)
	resumed := make(chan struct{})
	daemonPid := d.cmd.Process.Pid
	run, err := d.run(context.Background(), f.id)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		k, err := f.killAt(c, pt, daemonPid, resumed)
		found <- struct {
			k   struck
			err error
		}{k, err}
	}()
	_, rerr := d.c.Resume(context.Background(), f.id)
	close(resumed)
	got := <-found
	if got.err != nil {
		t.Fatalf("%s: %v (resume: %v)", c, got.err, rerr)
	}
	if rerr != nil {
		t.Logf("%s: resume: %v", c, rerr)
	}
	got.k.segs = run.Segments
	if got.k.fired && c.daemonDies() {
		select {
		case <-d.done:
		case <-time.After(time.Minute):
			// Armed at c.lostAt, every page came all the same.
			t.Logf("%s: the daemon did not reach %s in a minute: killed", c, c.lostAt)
			_ = d.cmd.Process.Kill()
			<-d.done
		}
		d.cmd = nil
	}
	return got.k
}

// point is where and how a case strikes: once share of the buffer is
// resident; with a fork, fork before the first kill; the victims in
// order (a permutation of lazy-pages, server, daemon), spread apart.
type point struct {
	share        float64
	fork, spread time.Duration
	order        []int
}

// killAt finds the lazy restore of f's run (lazy-pages, then its page
// server by the pid the restore records) and, once lazy-pages holds both
// tasks' userfaultfds and pt.share of the buffer is resident, kills c's
// victims as pt says; with c.fork, the oracle forks first. Past 5%, the
// point waits for the resume's answer (the unit runs); below, it can
// come before.
func (f *faults) killAt(c faultCase, pt point, daemonPid int, resumed <-chan struct{}) (struck, error) {
	var k struck
	deadline := time.Now().Add(2 * time.Minute)
	for k.lazyPages == 0 {
		if time.Now().After(deadline) {
			return k, errors.New("no lazy-pages")
		}
		k.lazyPages, _ = lazyPages(f.d, f.id)
		time.Sleep(200 * time.Microsecond)
	}
	cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(k.lazyPages), "cmdline"))
	args := strings.Split(string(cmd), "\x00")
	for i, a := range args {
		if a == "--work-dir" && i+1 < len(args) {
			k.work = args[i+1]
		}
	}
	if k.work == "" {
		return k, fmt.Errorf("lazy-pages %d names no work directory: %q", k.lazyPages, args)
	}
	size := float64(faultsBuffer)
	for {
		if time.Now().After(deadline) {
			return k, fmt.Errorf("lazy-pages %d: %.0f%% resident never seen", k.lazyPages, 100*pt.share)
		}
		if k.server == 0 {
			// The record of this restore's server (a failed one's is gone).
			pid := readPidFile(filepath.Join(filepath.Dir(k.work), "page-server.pid"))
			if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil && bytes.Contains(env, []byte("="+k.work+"\x00")) {
				k.server = pid
			}
		}
		n, alive := uffdsHeld(k.lazyPages)
		if !alive {
			return k, nil // every page in (or the restore failed): not open
		}
		if (n >= 2 && k.server != 0) || (c.restoring && n >= 1) {
			unit, rss := f.unitRSS()
			if c.fork || pt.share >= 0.05 {
				select {
				case <-resumed:
				default:
					rss = 0
				}
			}
			if (unit != 0 || c.restoring) && float64(rss) >= pt.share*size {
				k.resident = float64(rss) / size
				if c.fork {
					k.oracle, k.children = unit, children(unit)
					_ = syscall.Kill(unit, syscall.SIGUSR2)
					forked := time.Now()
					time.Sleep(pt.fork)
					k.forked = time.Since(forked)
				}
				_, k.open = uffdsHeld(k.lazyPages)
				k.fired, k.spread = true, pt.spread
				pids := [3]int{0: k.lazyPages, 1: k.server, 2: daemonPid}
				on := [3]bool{0: c.v.lazyPages, 1: c.v.server, 2: c.v.daemon}
				n := 0
				for _, i := range pt.order {
					if !on[i] || pids[i] == 0 {
						continue
					}
					if n++; n > 1 {
						time.Sleep(pt.spread)
					}
					_ = syscall.Kill(pids[i], syscall.SIGKILL)
				}
				return k, nil
			}
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// unitRSS is the host pid of the oracle (the unit process whose pid in
// its namespace is 1), and how much of its memory is resident, in bytes.
func (f *faults) unitRSS() (pid int, rss int64) {
	for _, p := range f.d.unitPids() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(l); len(fs) > 2 && fs[0] == "NSpid:" && fs[len(fs)-1] == "1" {
				pid = p
			} else if len(fs) == 3 && fs[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(fs[1], 10, 64)
				rss = kb << 10
			}
		}
		if pid != 0 {
			return pid, rss
		}
	}
	return 0, 0
}

// unitPids are the processes in the daemon's sandbox cgroups (its
// memory hierarchy's, or v2's).
func (d *daemon) unitPids() []int {
	var out []int
	for _, dir := range d.cgroupDirs() {
		if !strings.Contains(dir, "/memory/") && strings.Count(strings.TrimPrefix(dir, "/sys/fs/cgroup/"), "/") != 0 {
			continue
		}
		_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.Name() == "cgroup.procs" {
				b, _ := os.ReadFile(p)
				for _, s := range strings.Fields(string(b)) {
					if n, err := strconv.Atoi(s); err == nil {
						out = append(out, n)
					}
				}
			}
			return nil
		})
	}
	return out
}

// readPidFile is the pid a pid file holds, 0 without one.
func readPidFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// settle checks what became of the run after k: with the daemon killed,
// first (c.reused) the recorded pids are made to name other live
// processes, and the daemon restarted. The run is then parked back at
// f.snap, its interval journaled pages-lost; or it went on (a park
// succeeds). Every line is the oracle's own, the record verifies, and
// nothing of a lost interval is left running.
func (f *faults) settle(c faultCase, k struck) {
	t, d := f.t, f.d
	ctx := context.Background()
	var decoys []int
	if c.daemonDies() {
		d.env = nil
		if c.reused {
			decoys = f.reusePids(k)
		}
		restart := time.Now()
		mustStart(t, d)
		took := time.Since(restart)
		t.Logf("%s: the daemon answered %v after its restart", c, took.Round(time.Millisecond))
		// A restore cut off with its lazy-pages or page server must not
		// hold the restarted daemon up (a normal restart: 0.4-3 s; one
		// whose freeze fails, 5 s more).
		if took > restartBound {
			t.Errorf("%s: the restarted daemon answered after %v, over %v", c, took.Round(time.Millisecond), restartBound)
		}
	}
	if c.fork {
		t.Logf("%s: struck %v after the fork", c, k.forked)
	}
	wentOn, forkChecked := false, false
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the run neither parked back nor went on in 2 minutes", c)
		}
		run, err := d.run(ctx, f.id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Phase == "parked" {
			break
		}
		if run.Phase != "executing" {
			t.Fatalf("%s: run %+v", c, run)
		}
		if c.fork && !forkChecked {
			// Every page in, the forked copy's buffer is the oracle's.
			rs := mustShow(t, d, f.id).Restore
			if rs != nil && rs.ResidentNS == 0 && rs.PagesLost == "" {
				continue
			}
			if rs != nil && rs.ResidentNS > 0 {
				f.checkForked(c, k)
			}
			forkChecked = true
		}
		// Executing: a park waits for every page, or is refused once
		// they are lost (the daemon parks the run back).
		_, err = d.c.Park(ctx, f.id)
		if err == nil {
			wentOn = true
			break
		}
		var ae *api.Error
		if !errors.As(err, &ae) || (ae.Code != api.CodePagesLost && ae.Code != api.CodePhase && ae.Code != api.CodeConflict) {
			t.Fatalf("%s: park: %v", c, err)
		}
	}
	if decoys != nil {
		// Once the sandbox's CRIU directory, the pid records with it, is
		// removed, its destroy has killed what it would.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Dir(k.work)); errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s still there 30 s after the park back", c, filepath.Dir(k.work))
			}
		}
		for _, pid := range decoys {
			if !alive(pid) {
				t.Fatalf("%s: process %d, which took a recorded pid, was killed", c, pid)
			}
		}
		f.killDecoys()
	}
	f.checkLines(c)
	if c.v == (victims{}) && !wentOn {
		t.Fatalf("%s: the run did not go on", c)
	}
	s := mustShow(t, d, f.id)
	n := len(s.Segments)
	ex, back := s.Segments[n-2], s.Segments[n-1]
	switch {
	case n == k.segs && back.Kind == "suspended" && back.Snapshot == f.snap:
		// Struck before the restore returned: the resume failed, the
		// run stayed parked, nothing appended.
		t.Logf("%s: the restore failed; the run stayed parked", c)
		f.noneLeft(c)
	case n != k.segs+3 || ex.Kind != "executed" || back.Kind != "suspended" || ex.Outcome != "parked":
		t.Fatalf("%s: segments %s (%d before the resume)", c, kinds(s.Segments), k.segs)
	default:
		f.checkInterval(c, k, ex, back, wentOn)
	}
	if err := verifyRun(ctx, d, f.id); err != nil {
		t.Fatal(err)
	}
}

// checkInterval checks the interval the lazy resume began: parked back
// at f.snap, journaled pages-lost, nothing of it left running; or, when
// it went on, parked with every page resident.
func (f *faults) checkInterval(c faultCase, k struck, ex, back api.Segment, wentOn bool) {
	t := f.t
	_, j := f.d.journal(t, ex)
	var lost struct {
		AfterNS int64  `json:"after_ns"`
		Reason  string `json:"reason"`
	}
	lostEntry := lifecycleEntry(j, "pages-lost", &lost)
	if wentOn {
		// The park's dump holds the whole buffer: the next resume checks
		// it byte for byte.
		if lostEntry || ex.Restore == nil || ex.Restore.PagesLost != "" || ex.Restore.ResidentNS <= 0 {
			t.Fatalf("%s: went on, but the interval's restore %+v (pages-lost entry: %v)", c, ex.Restore, lostEntry)
		}
		t.Logf("%s: went on, every page resident %v after the restore began", c, time.Duration(ex.Restore.ResidentNS))
		f.snap, f.atPark = back.Snapshot, last(output(t, f.d.stdout(f.id)))
		return
	}
	if back.Snapshot != f.snap || ex.Restore == nil || !ex.Restore.Lazy || ex.Restore.PagesLost == "" ||
		!lostEntry || lost.AfterNS <= 0 || lifecycleEntry(j, "checkpointed", nil) {
		t.Fatalf("%s: parked back at %s (want %s); the interval's restore %+v; journal %s", c, back.Snapshot, f.snap, ex.Restore, crashEvents(j))
	}
	t.Logf("%s: parked back, pages lost %v after the restore began: %s", c, time.Duration(lost.AfterNS), lost.Reason)
	f.noneLeft(c)
}

// checkForked checks, every page in, that the process the oracle forked
// in the lazy window holds the oracle's buffer, byte for byte.
func (f *faults) checkForked(c faultCase, k struck) {
	t := f.t
	var child []int
	for _, p := range children(k.oracle) {
		if !slices.Contains(k.children, p) {
			child = append(child, p)
		}
	}
	at := last(output(t, f.d.stdout(f.id))).BufAddr
	if len(child) != 1 || at == 0 {
		t.Fatalf("%s: forked %v (children before %v), the buffer at %#x", c, child, k.children, at)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", child[0]))
	if err != nil {
		// A zombie's stat ends with its exit code (9: killed, by the OOM
		// killer if the unit's grant is too small).
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child[0]))
		t.Fatalf("%s: the forked copy %d: %v; its stat: %s", c, child[0], err, st)
	}
	defer mem.Close()
	want, got := oraclePattern(faultsBuffer), make([]byte, 1<<20)
	for off := 0; off < len(want); off += len(got) {
		if _, err := mem.ReadAt(got, int64(at)+int64(off)); err != nil {
			t.Fatalf("%s: the forked copy's buffer at +%d: %v", c, off, err)
		}
		if !bytes.Equal(got, want[off:off+len(got)]) {
			t.Fatalf("%s: the forked copy's buffer differs from the oracle's in the MiB at +%d", c, off)
		}
	}
	t.Logf("%s: the forked copy's %d MiB are the oracle's", c, faultsBuffer>>20)
}

// oraclePattern is the oracle's buffer of size bytes (units/oracle's
// fill: xorshift64 from a fixed seed, little-endian).
func oraclePattern(size int) []byte {
	buf := make([]byte, size)
	x := uint64(0x9E3779B97F4A7C15)
	for i := 0; i+8 <= len(buf); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(buf[i:], x)
	}
	return buf
}

// children is process pid's children (of every thread).
func children(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// checkLines checks that every line the oracle wrote is one computed on
// its own buffer, by the one process.
func (f *faults) checkLines(c faultCase) {
	for i, l := range output(f.t, f.d.stdout(f.id)) {
		if l.Checksum != f.first.Checksum || l.Verify != f.first.Checksum || l.StartTime != f.first.StartTime {
			f.t.Fatalf("%s: line %d %+v; first %+v", c, i, l, f.first)
		}
	}
}

// noneLeft checks, within 30 s, that no lazy-pages or page server of a
// restore of f's run, and no unit process, is left.
func (f *faults) noneLeft(c faultCase) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		if pid, _ := lazyPages(f.d, f.id); pid != 0 {
			left = append(left, fmt.Sprintf("lazy-pages %d", pid))
		}
		if pid := pageServer(f.d, f.id); pid != 0 {
			left = append(left, fmt.Sprintf("page server %d", pid))
		}
		if ps := f.d.unitPids(); len(ps) > 0 {
			left = append(left, fmt.Sprintf("unit processes %v", ps))
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: left running: %s", c, strings.Join(left, ", "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pageServer is the pid of a page server of d's restore of run id (its
// environment names the restore's work directory), 0 when there is none.
func pageServer(d *daemon, id string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(env, []byte("\x00RUNRECORDD_PAGE_SERVER_OF=")) && bytes.Contains(env, []byte(d.root)) &&
			bytes.Contains(env, []byte(filepath.Join("criu", id, "restore")+"\x00")) {
			return n
		}
	}
	return 0
}

// crashAt has the daemon, armed at c's failpoint (failpoint.LazySteps),
// resume the run: it dies there; started again, it finds the run parked
// at f.snap (Resumed was not durable), nothing of the restore left
// running. The next case's resume and park go on from there (a park
// that waited for a page server would not end).
func (f *faults) crashAt(c faultCase) {
	t, d := f.t, f.d
	mustStop(t, d)
	d.env = []string{failpoint.Env + "=" + c.failpoint}
	mustStart(t, d)
	before, err := d.run(context.Background(), f.id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.c.Resume(context.Background(), f.id); err == nil {
		t.Fatalf("the resume armed at %s answered", c.failpoint)
	}
	crashKilled(t, d, c.failpoint)
	d.env = nil
	mustStart(t, d)
	s := mustShow(t, d, f.id)
	if n := len(s.Segments); n != before.Segments || s.Segments[n-1].Kind != "suspended" || s.Segments[n-1].Snapshot != f.snap {
		t.Fatalf("%s: segments %s, want %d, the last at %s", c, kinds(s.Segments), before.Segments, f.snap)
	}
	f.noneLeft(c)
	f.checkLines(c)
	if err := verifyRun(context.Background(), d, f.id); err != nil {
		t.Fatal(err)
	}
}

// reusePids makes the records of the lazy restore's pids (lazy-pages and
// page server, both killed with the daemon) name other live processes: a
// process of another pid namespace (as a unit's is) whose command line
// holds lazy-pages' whole arguments, and an unrelated process of this
// one. The restarted daemon must neither trust nor kill them; it returns
// their pids. killDecoys ends them.
func (f *faults) reusePids(k struck) []int {
	t := f.t
	for _, pid := range []int{k.lazyPages, k.server} {
		for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still there 10 s after SIGKILL", pid)
			}
		}
	}
	start := func(cmd *exec.Cmd) *exec.Cmd {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		f.decoys = append(f.decoys, cmd)
		t.Cleanup(f.killDecoys)
		return cmd
	}
	ns := start(exec.Command("unshare", "--pid", "--fork", "--kill-child", "--", "sh", "-c", "sleep 1000", "lazy-pages", k.work))
	mimic := 0
	for deadline := time.Now().Add(5 * time.Second); mimic == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no child of unshare %d", ns.Process.Pid)
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", ns.Process.Pid, ns.Process.Pid))
		if fs := strings.Fields(string(b)); len(fs) == 1 {
			mimic, _ = strconv.Atoi(fs[0])
		}
	}
	other := start(exec.Command("sleep", "1000")).Process.Pid
	dir := filepath.Dir(k.work)
	for name, pid := range map[string]int{"lazy-pages.pid": mimic, "page-server.pid": other} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strconv.Itoa(pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("the recorded pids now name %d (another pid namespace, lazy-pages' arguments) and %d (sleep)", mimic, other)
	return []int{mimic, other}
}

// alive reports whether process pid runs (is there, and not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	st := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(st) > 0 && st[0] != "Z" && st[0] != "X"
}

// killDecoys ends reusePids' processes.
func (f *faults) killDecoys() {
	for _, cmd := range f.decoys {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	f.decoys = nil
}
