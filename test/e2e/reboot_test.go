//go:build linux

package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// TestReboot reboots a host as a shutdown does (docs/operations.md). The
// daemon is started as the shipped systemd unit starts it (asUnit: its
// ExecStart, environment file, config file and systemd's variables), so
// it runs under its default stop policy (park), and holds an executing
// image run, a parked image run, a transcript run parked on an await and
// a transcript run executing (in its thinking). It is stopped with
// SIGTERM, as systemd stops it; then every process of its state directory
// (shims, containerd) and every unit in its cgroups is killed, and what is
// mounted under the state directory goes, as a power cycle leaves a host.
// Started again on the same state directory, it says READY=1 (where
// `systemctl start` returns) only once the runs the stop parked are back:
//
//   - the executing image run is executing again, one process from its
//     start: the stop parked it and the start resumed it;
//   - the parked image run is still parked, and resumes with its process
//     state;
//   - the executing transcript run is executing again, its wait proof
//     still proved (the stop parked it with its call account);
//   - the transcript run parked on its await takes its posted result.
func TestReboot(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	notify, got := notifySocket(t)
	d := mustDaemon(t, "reboot", asUnit(t, notify))
	await(t, got, d.cmd.Process.Pid, "READY=1", 2*time.Minute)
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	const executing, parked, awaiting, thinking = "rb-executing", "rb-parked", "rb-awaiting", "rb-thinking"
	startOracle(t, d, executing, oracleImage)
	startOracle(t, d, parked, oracleImage)
	_, atPark := park(t, d, parked)
	trStart(t, d, awaiting, trAgentImage, "STEPS=2")
	trParked(t, d, awaiting, 2)
	// Its thinking outlasts the test: it is executing at the stop.
	trStart(t, d, thinking, trAgentImage, "STEPS=1", "WORK_ITERS=2000000000")
	waitSaidText(t, d, thinking, "step 1: thinking")

	stopping := time.Now()
	stopped := d.cmd.Process.Pid
	mustStop(t, d)
	t.Logf("stop, parking the 2 executing runs: %v", time.Since(stopping).Round(time.Millisecond))
	atStop := last(output(t, d.stdout(executing)))
	rebootHost(t, d)
	starting := time.Now()
	mustStart(t, d)
	readyAfter(t, got, d.cmd.Process.Pid, stopped)
	t.Logf("from the start to READY=1: %v", time.Since(starting).Round(time.Millisecond))
	for _, id := range []string{executing, thinking} {
		if r, err := d.run(ctx, id); err != nil || r.Phase != "executing" {
			t.Fatalf("at READY=1, %s: %+v, %v; want it executing again (systemctl start returns at READY=1)", id, r, err)
		}
	}

	t.Run("ExecutingImageRun", func(t *testing.T) {
		r := trWait(t, d, executing, "resumed by the start", func(r api.Run) bool { return r.Phase == "executing" && r.Segments >= 3 })
		if r.Status != "running" || r.Segments != 3 {
			t.Fatalf("after the reboot: %+v, want running with 3 segments (parked by the stop, resumed by the start)", r)
		}
		t.Logf("from the start to the run resumed: %v", time.Since(starting).Round(time.Millisecond))
		ls := waitLines(t, d.stdout(executing), "a line verified after the reboot", func(ls []line) bool {
			return len(ls) > 0 && last(ls).VerifiedAt > atStop.Counter
		})
		checkOneProcess(t, ls)
		if got, want := kinds(mustShow(t, d, executing).Segments), "executed suspended resumed"; got != want {
			t.Fatalf("segments %s, want %s", got, want)
		}
	})
	t.Run("ParkedImageRun", func(t *testing.T) {
		r, err := d.run(ctx, parked)
		if err != nil || r.Phase != "parked" || r.Segments != 2 {
			t.Fatalf("after the reboot: %+v, %v; want it parked as it was (2 segments)", r, err)
		}
		resume(t, d, parked, nil, atPark)
	})
	t.Run("ExecutingTranscriptRun", func(t *testing.T) {
		r := trWait(t, d, thinking, "resumed by the start", func(r api.Run) bool { return r.Phase == "executing" && r.Segments >= 3 })
		if r.Status != "running" || r.Segments != 3 {
			t.Fatalf("after the reboot: %+v, want running with 3 segments (parked by the stop, resumed by the start)", r)
		}
		wp, err := d.c.WaitProof(ctx, thinking)
		if err != nil || wp.Verdict != "NonBlocking" {
			t.Fatalf("wait proof %+v, %v; want NonBlocking (the stop's park kept the interval's call account)", wp, err)
		}
		t.Logf("wait proof: %s: %s", wp.Verdict, wp.Reason)
	})
	t.Run("TranscriptRunOnAwait", func(t *testing.T) {
		r, err := d.run(ctx, awaiting)
		if err != nil || r.Phase != "parked" || r.Segments != 2 {
			t.Fatalf("after the reboot: %+v, %v; want it parked on its await as it was", r, err)
		}
		trPost(t, d, awaiting, "call-1", trResult(1))
		trParked(t, d, awaiting, 5)
		wp, err := d.c.WaitProof(ctx, awaiting)
		if err != nil || wp.Verdict != "NonBlocking" {
			t.Fatalf("wait proof %+v, %v; want NonBlocking", wp, err)
		}
	})
}

// readyAfter waits up to 2 minutes for READY=1 from pid, the daemon
// started after the one of pid stopped, whose last notifications may
// still be read first.
func readyAfter(t *testing.T, got <-chan notification, pid, stopped int) {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case m := <-got:
			switch {
			case m.pid == int32(stopped):
			case m.pid != int32(pid):
				t.Fatalf("notification %q from pid %d, not the daemon's %d", m.text, m.pid, pid)
			case strings.Contains(m.text, "READY=1\n"):
				return
			}
		case <-deadline:
			t.Fatal("no READY=1 within 2m of the start")
		}
	}
}

// waitSaidText waits until transcript run id's unit output holds an
// "append" of text.
func waitSaidText(t *testing.T, d *daemon, id, text string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(d.stdout(id))
		if strings.Contains(string(b), `"text":"`+text+`"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: its unit did not say %q: %s", id, text, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rebootHost does to d's stopped daemon's host what a power cycle does:
// every unit in its cgroups and every process of its state directory
// (shims, containerd) killed, then what is mounted under it unmounted.
func rebootHost(t *testing.T, d *daemon) {
	t.Helper()
	if d.running() {
		t.Fatal("reboot: the daemon is running")
	}
	killed := 0
	for range 50 {
		var pids []int
		for _, dir := range d.cgroupDirs() {
			_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
				if err == nil && e.Name() == "cgroup.procs" {
					b, _ := os.ReadFile(p)
					for _, f := range strings.Fields(string(b)) {
						if pid, err := strconv.Atoi(f); err == nil {
							pids = append(pids, pid)
						}
					}
				}
				return nil
			})
		}
		for _, p := range d.processes() {
			if pid, err := strconv.Atoi(strings.SplitN(p, ":", 2)[0]); err == nil {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil || !errors.Is(err, syscall.ESRCH) {
				killed++
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if left := d.processes(); len(left) > 0 || d.cgroupProcs() > 0 {
		t.Fatalf("reboot: still running after SIGKILL: %s; %d in the cgroups", strings.Join(left, "; "), d.cgroupProcs())
	}
	d.unmount()
	t.Logf("reboot: %d processes killed, the mounts under %s gone", killed, d.root)
}

// TestParkAllThenRestart: `park --all` parks every executing run (and
// only those) and reports each; the daemon, stopped under the leave
// policy (not under systemd) and started again, resumes the runs it
// parked, each one process from its start, and leaves a run parked by
// hand parked.
func TestParkAllThenRestart(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := mustDaemon(t, "park-all")
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const a, b, byHand = "pa-a", "pa-b", "pa-by-hand"
	startOracle(t, d, a, oracleImage)
	startOracle(t, d, b, oracleImage)
	startOracle(t, d, byHand, oracleImage)
	park(t, d, byHand)
	p, err := d.c.ParkAll(ctx, api.ParkAllRequest{Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range p.Runs {
		if r.Error != nil || r.Park == nil || r.Park.Run.Status != "parked (image)" {
			t.Fatalf("park --all: %s: %+v (error %+v)", r.Run, r.Park, r.Error)
		}
		got[r.Run] = true
	}
	if p.Parked != 2 || p.Left != 0 || len(p.Runs) != 2 || !got[a] || !got[b] {
		t.Fatalf("park --all: %+v, want %s and %s parked", p, a, b)
	}
	atPark := map[string]line{a: last(output(t, d.stdout(a))), b: last(output(t, d.stdout(b)))}
	mustStop(t, d)
	mustStart(t, d)
	for _, id := range []string{a, b} {
		r := trWait(t, d, id, "resumed by the start", func(r api.Run) bool { return r.Phase == "executing" })
		if r.Status != "running" || r.Segments != 3 {
			t.Fatalf("%s after the restart: %+v, want running with 3 segments", id, r)
		}
		ls := waitLines(t, d.stdout(id), "a line verified after the restart", func(ls []line) bool {
			return len(ls) > 0 && last(ls).VerifiedAt > atPark[id].Counter
		})
		checkOneProcess(t, ls)
	}
	if r, err := d.run(ctx, byHand); err != nil || r.Phase != "parked" || r.Segments != 2 {
		t.Fatalf("%s after the restart: %+v, %v; want it parked as it was", byHand, r, err)
	}
}

// TestStopLeavesNoCgroup: a daemon stopped under its default policy
// parks its runs and leaves no cgroup of its sandboxes behind, in any
// hierarchy: the parent it made them under goes with its last sandbox.
func TestStopLeavesNoCgroup(t *testing.T) {
	privileged(t)
	d := mustDaemon(t, "stop-cgroup", func(d *daemon) { d.stopDefault = true })
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	startOracle(t, d, "sc-a", oracleImage)
	if len(d.cgroupDirs()) == 0 {
		t.Fatalf("no cgroup %s while a run executes", d.cgroup())
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if left := d.cgroupDirs(); len(left) > 0 {
		t.Errorf("the stopped daemon left its sandboxes' cgroups: %s", strings.Join(left, " "))
	}
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
}

// TestBackupRestore backs a state directory up and restores it as
// docs/operations.md says ("Backup and restore of a state directory"),
// with its tar commands: the daemon stopped under the park policy, the
// directory archived, the daemon started and its runs gone on past the
// backup, then stopped, the directory emptied and the archive extracted.
// Started on it, the host is back at the backup: the image run the stop
// parked is resumed by the start from the backup's park, one process with
// the output it had then, and the transcript run is parked on the await
// it was on, and takes its result again.
func TestBackupRestore(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := mustDaemon(t, "backup", func(d *daemon) { d.stopDefault = true })
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	const img, awaiting = "br-image", "br-awaiting"
	startOracle(t, d, img, oracleImage)
	trStart(t, d, awaiting, trAgentImage, "STEPS=2")
	trParked(t, d, awaiting, 2)

	mustStop(t, d)
	atBackup := last(output(t, d.stdout(img)))
	archive := filepath.Join(t.TempDir(), "runrecordd.tgz")
	tarRun(t, "-C", d.state, "--xattrs", "--xattrs-include=*", "--numeric-owner",
		"--exclude=./runrecordd.sock", "--exclude=./secrets", "-czf", archive, ".")

	// The host goes on past the backup.
	mustStart(t, d)
	trWait(t, d, img, "resumed by the start", func(r api.Run) bool { return r.Phase == "executing" })
	waitLines(t, d.stdout(img), "lines past the backup", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > atBackup.Counter+2
	})
	trPost(t, d, awaiting, "call-1", trResult(1))
	trParked(t, d, awaiting, 5)
	mustStop(t, d)

	// Restored: the state directory emptied, the archive extracted.
	d.unmount()
	if err := os.RemoveAll(d.state); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(d.state, 0o700); err != nil {
		t.Fatal(err)
	}
	tarRun(t, "-C", d.state, "--xattrs", "--xattrs-include=*", "--numeric-owner", "-xzpf", archive)
	mustStart(t, d)
	r := trWait(t, d, img, "resumed by the start from the backup's park", func(r api.Run) bool { return r.Phase == "executing" })
	if r.Status != "running" || r.Segments != 3 {
		t.Fatalf("after the restore: %+v, want running with 3 segments (the backup's park resumed)", r)
	}
	ls := waitLines(t, d.stdout(img), "a line verified after the restore", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > atBackup.Counter
	})
	checkOneProcess(t, ls)
	if tr, err := d.run(ctx, awaiting); err != nil || tr.Phase != "parked" || tr.Segments != 2 {
		t.Fatalf("after the restore: %+v, %v; want it parked on its await as at the backup", tr, err)
	}
	trPost(t, d, awaiting, "call-1", trResult(1))
	trParked(t, d, awaiting, 5)
	if v, err := d.c.Verify(ctx, awaiting); err != nil || !v.OK {
		t.Fatalf("verify after the restore: %+v, %v", v, err)
	}
}

// tarRun runs tar with args, failing t on an error.
func tarRun(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
		t.Fatalf("tar %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
