//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A stand-in criu, first on a daemon's PATH (the daemon passes its PATH to
// its containerd, and so to runc): it runs the real CRIU until the file
// hang exists, and from then on hangs in everything but `criu --version`
// and `criu check`, as CRIU 4.1.1 did in every dump on some machines.
type standIn struct {
	bin  string // the directory to put first on PATH
	hang string // while it exists, criu hangs
}

func newStandIn(t *testing.T) standIn {
	t.Helper()
	real, err := exec.LookPath("criu")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := standIn{bin: filepath.Join(dir, "bin"), hang: filepath.Join(dir, "hang")}
	if err := os.Mkdir(s.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// exec: the hanging process is the one runc started, as a real
	// CRIU's would be.
	script := fmt.Sprintf("#!/bin/sh\ncase \"$1\" in --version|check) exec %[2]q \"$@\";; esac\n"+
		"if [ -e %[1]q ]; then exec sleep 3600; fi\nexec %[2]q \"$@\"\n", s.hang, real)
	if err := os.WriteFile(filepath.Join(s.bin, "criu"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s standIn) hangs(t *testing.T, on bool) {
	t.Helper()
	var err error
	if on {
		err = os.WriteFile(s.hang, nil, 0o600)
	} else {
		err = os.Remove(s.hang)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// daemon options: the stand-in first on PATH, and a short CRIU deadline.
func (s standIn) on(deadline string) func(*daemon) {
	return func(d *daemon) {
		d.env = []string{"PATH=" + s.bin + string(os.PathListSeparator) + os.Getenv("PATH")}
		d.flags = []string{"--criu-deadline", deadline}
	}
}

// noStandIn fails the test if a hanging stand-in is still running.
func noStandIn(t *testing.T) {
	t.Helper()
	out, _ := exec.Command("pgrep", "-f", "^sleep 3600$").Output()
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Fatalf("a hanging criu is still running (pids %s): the deadline did not kill it", s)
	}
}

// waitImageParks waits for the daemon's probe and returns what it found.
func waitImageParks(t *testing.T, d *daemon) api.ImageParks {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h, err := d.c.Host(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if h.ImageParks.Status != "probing" {
			return h.ImageParks
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %s daemon is still probing after 2m", d.name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestCRIUDeadline parks and resumes the oracle on a daemon whose CRIU
// hangs on demand. A hanging dump costs one deadline: CRIU is killed, the
// park fails with checkpoint_timeout, the record is unchanged and the unit
// goes on as the same process, not frozen — also after the daemon
// restarts. A hanging restore costs one deadline too: restore_timeout, the
// run stays parked and resumes once CRIU works again.
func TestCRIUDeadline(t *testing.T) {
	privileged(t)
	parallelCrash(t) // parallel_test.go
	ctx := context.Background()
	s := newStandIn(t)
	d := mustDaemon(t, "deadline", s.on("3s"))
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	if ip := waitImageParks(t, d); ip.Status != "available" {
		t.Fatalf("image parks %+v with a working CRIU", ip)
	}
	const id = "stuck"
	startOracle(t, d, id, oracleImage)
	was, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	s.hangs(t, true)
	t0 := time.Now()
	_, err = d.c.Park(ctx, id)
	took := time.Since(t0)
	ae := apiError(t, err, "checkpoint_timeout")
	t.Logf("park with a hanging CRIU: %v after %v", ae, took)
	if took < 3*time.Second || took > 40*time.Second {
		t.Fatalf("the park failed after %v with a 3s deadline", took)
	}
	noStandIn(t)
	unchanged(t, d, id, was)
	at := last(output(t, d.stdout(id)))
	ls := waitLines(t, d.stdout(id), "the oracle going on after the failed park", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > at.Counter+5
	})
	checkOneProcess(t, ls)

	// A restart finds the unit running (not lost) and takes it back.
	mustStop(t, d)
	mustStart(t, d)
	if r, err := d.run(ctx, id); err != nil || r.Status != "running" || r.Segments != was.Segments || r.Head != was.Head {
		t.Fatalf("after a restart: %+v, %v; before %+v", r, err, was)
	}
	at = last(output(t, d.stdout(id)))
	ls = waitLines(t, d.stdout(id), "the oracle going on after the restart", func(ls []line) bool {
		return len(ls) > 0 && last(ls).Counter > at.Counter+5
	})
	checkOneProcess(t, ls)

	// The restarted daemon probed with CRIU hanging: image parks are off
	// until a restart with a CRIU that works.
	ip := waitImageParks(t, d)
	if ip.Status != "unavailable" || !strings.Contains(ip.Reason, "did not finish within 3s") {
		t.Fatalf("image parks %+v, probed with a hanging CRIU", ip)
	}
	_, err = d.c.Park(ctx, id)
	apiError(t, err, "image_parks_unavailable")
	unchanged(t, d, id, was)
	s.hangs(t, false)
	mustStop(t, d)
	mustStart(t, d)
	if ip := waitImageParks(t, d); ip.Status != "available" {
		t.Fatalf("image parks %+v after a restart with a working CRIU", ip)
	}

	// A hanging restore.
	p, atPark := park(t, d, id)
	s.hangs(t, true)
	parked, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	_, err = d.c.Resume(ctx, id)
	took = time.Since(t0)
	ae = apiError(t, err, "restore_timeout")
	t.Logf("resume with a hanging CRIU: %v after %v", ae, took)
	if took < 3*time.Second || took > 40*time.Second {
		t.Fatalf("the resume failed after %v with a 3s deadline", took)
	}
	noStandIn(t)
	unchanged(t, d, id, parked)
	if parked.Status != "parked (image)" || parked.Head != p.Run.Head {
		t.Fatalf("after the failed resume: %+v; parked %+v", parked, p.Run)
	}
	if left := d.sandboxProcesses(id); len(left) > 0 {
		t.Fatalf("the failed restore left processes: %s", strings.Join(left, "; "))
	}
	s.hangs(t, false)
	resume(t, d, id, nil, atPark)
}

// TestImageParksUnavailable starts a daemon whose CRIU hangs from the
// start: its probe fails at the deadline, `host` says why, image runs are
// refused with image_parks_unavailable, and transcript runs still run and
// park.
func TestImageParksUnavailable(t *testing.T) {
	privileged(t)
	parallelCrash(t) // parallel_test.go
	ctx := context.Background()
	s := newStandIn(t)
	s.hangs(t, true)
	d := mustDaemon(t, "no-criu", s.on("2s"))
	ip := waitImageParks(t, d)
	t.Logf("image parks: %+v", ip)
	if ip.Status != "unavailable" || !strings.Contains(ip.Reason, "did not finish within 2s") {
		t.Fatalf("image parks %+v with a hanging CRIU", ip)
	}
	noStandIn(t)
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	_, err := d.c.Start(ctx, api.RunRequest{ID: "img", Unit: unit.Spec{Image: oracleImage, Env: oracleEnv},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20}})
	apiError(t, err, "image_parks_unavailable")
	if runs, err := d.c.List(ctx, ""); err != nil || len(runs) != 0 {
		t.Fatalf("runs after the refusal: %+v, %v", runs, err)
	}
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	trStart(t, d, "tr", trAgentImage, "STEPS=1")
	trParked(t, d, "tr", 2)
}

// sandboxProcesses lists the processes of run id's sandboxes on d: its
// shims (with their children, the unit).
func (d *daemon) sandboxProcesses(id string) []string {
	var out []string
	for _, p := range d.processes() {
		if strings.Contains(p, "containerd-shim") && (strings.Contains(p, " -id "+id+" ") || strings.Contains(p, " -id "+id+"_t")) {
			out = append(out, p)
		}
	}
	return out
}

// criuHangsAfterSeize makes d's CRIU hang at its post-dump stage while the
// file hang exists: the unit seized, its TCP connections in repair mode
// and locked, the dump written — the worst place for a CRIU to die. It
// adds an action script to the CRIU configuration the daemon's runc hands
// CRIU (read at every dump).
func criuHangsAfterSeize(t *testing.T, d *daemon, hang string) {
	t.Helper()
	script := filepath.Join(d.root, "hang-after-seize.sh")
	body := fmt.Sprintf("#!/bin/sh\nif [ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] && [ -e %q ]; then exec sleep 3600; fi\nexit 0\n", hang)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(d.state, "containerd", "executor", "criu.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "action-script %s\n", script); err != nil {
		t.Fatal(err)
	}
}

// TestCRIUKilledAfterSeize kills CRIU where it holds the unit: seized,
// its TCP connections in repair mode behind CRIU's network lock. At the
// deadline the park fails with checkpoint_timeout and the unit goes on —
// its held connection too — and parks later. A daemon killed while CRIU
// hangs there leaves a CRIU that outlives it; the next start kills it,
// frees the unit the same way, and the run goes on.
func TestCRIUKilledAfterSeize(t *testing.T) {
	privileged(t)
	parallelCrash(t) // parallel_test.go
	ctx := context.Background()
	hang := filepath.Join(t.TempDir(), "hang")
	d := mustDaemon(t, "seized", func(d *daemon) { d.flags = []string{"--criu-deadline", "4s"} })
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "held"
	startTCPOracle(t, d, id)
	if ip := waitImageParks(t, d); ip.Status != "available" {
		t.Fatalf("image parks %+v", ip)
	}
	// The daemon rewrites the file at start: the script is added now.
	criuHangsAfterSeize(t, d, hang)
	was, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	goesOn := func(what string) {
		t.Helper()
		at := last(output(t, d.stdout(id)))
		waitLines(t, d.stdout(id), what, func(ls []line) bool { return last(ls).Counter >= at.Counter+12 })
		ls := tcpOutput(t, d.stdout(id))
		checkOneProcess(t, output(t, d.stdout(id)))
		checkTCP(t, ls, at.Counter+2)
	}

	if err := os.WriteFile(hang, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = d.c.Park(ctx, id)
	t.Logf("park with CRIU hanging after seize: %v", apiError(t, err, "checkpoint_timeout"))
	noStandIn(t)
	unchanged(t, d, id, was)
	goesOn("the oracle and its TCP state going on after the killed dump")

	// A client that gives up ends CRIU as the deadline does, before it.
	cctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	_, err = d.c.Park(cctx, id)
	cancel()
	if err == nil {
		t.Fatal("a park whose CRIU hangs succeeded")
	}
	for t0 := time.Now(); sleeping(t); time.Sleep(20 * time.Millisecond) {
		if time.Since(t0) > 3*time.Second {
			t.Fatal("CRIU still hangs 3s after the client gave up (its deadline is 4s)")
		}
	}
	unchanged(t, d, id, was)
	goesOn("the oracle and its TCP state going on after the cancelled park")

	// The daemon dies while CRIU hangs: CRIU outlives it, holding the unit.
	parked := make(chan error, 1)
	go func() { _, err := d.c.Park(ctx, id); parked <- err }()
	deadline := time.Now().Add(20 * time.Second)
	for !sleeping(t) {
		if time.Now().After(deadline) {
			t.Fatal("CRIU never reached its post-dump hook")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	d.cmd = nil
	<-parked
	if err := os.Remove(hang); err != nil {
		t.Fatal(err)
	}
	mustStart(t, d)
	noStandIn(t)
	if r, err := d.run(ctx, id); err != nil || r.Status != "running" || r.Head != was.Head {
		t.Fatalf("after the restart: %+v, %v; before %+v", r, err, was)
	}
	goesOn("the oracle and its TCP state going on after the restart")

	// And it parks and resumes as any unit does.
	_, atPark := park(t, d, id)
	resume(t, d, id, nil, atPark)
	goesOn("the oracle and its TCP state going on after a park")
}

// sleeping reports whether a hanging stand-in or hook (sleep 3600) runs.
func sleeping(t *testing.T) bool {
	out, _ := exec.Command("pgrep", "-f", "^sleep 3600$").Output()
	return len(strings.TrimSpace(string(out))) > 0
}
