//go:build linux

package e2e

// The warm pool (docs/warm-pool.md), end to end:
//
//   - TestWarmResume: an agent parked on its await gets its next
//     interval's sandbox made ahead (created, not started); the posted
//     result resumes it from that sandbox (the pool's counts, and the
//     idle energy's warm_pool inputs, say so), the agent finishes with
//     its transcript whole and the record verifies.
//   - TestWarmPoolFull: with a pool of one, a second parked run gets no
//     warm sandbox and resumes as without a pool; the first still resumes
//     warm.
//   - TestWarmDiscarded: a run closed, a run exported with its handoff
//     and a daemon stopped lose their warm sandboxes: nothing of them is
//     left.
//   - TestWarmRestart: a daemon killed with a warm sandbox held leaves
//     nothing of it once restarted (no container, process, cgroup or
//     channel directory), the run parked as it was; the posted result
//     then resumes it.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// warmMetrics reads d's /metrics lines that start with prefix, as
// name{labels} → value.
func warmMetrics(t *testing.T, d *daemon, prefix string) map[string]float64 {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.socket)
	}}}
	resp, err := hc.Get("http://runrecordd/metrics")
	if err != nil {
		t.Fatalf("metrics of the %s daemon: %v", d.name, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// warmReady waits until d's pool holds n warm sandboxes ready.
func warmReady(t *testing.T, d *daemon, n int) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := warmMetrics(t, d, "runrecordd_warm_pool")
		if m[`runrecordd_warm_pool_sandboxes{state="ready"}`] == float64(n) && m[`runrecordd_warm_pool_sandboxes{state="preparing"}`] == 0 {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %s daemon's pool: %v, want %d ready; log %s", d.name, m, n, d.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// warmSandboxLeft lists what is left of sandbox sid: its cgroups and the
// processes naming it.
func warmSandboxLeft(d *daemon, sid string) []string {
	var left []string
	for _, pat := range []string{"/sys/fs/cgroup/*/runrecordd*/" + sid, "/sys/fs/cgroup/runrecordd*/" + sid} {
		m, _ := filepath.Glob(pat)
		left = append(left, m...)
	}
	for _, p := range d.processes() {
		if strings.Contains(p, " "+sid+" ") || strings.HasSuffix(p, " "+sid) {
			left = append(left, p)
		}
	}
	return left
}

// warmGated checks that warm sandbox sid's one process is the gate
// (docs/warm-pool.md), waiting: the daemon under test has the gate beside
// it (buildDaemon).
func warmGated(t *testing.T, sid string) {
	t.Helper()
	procs, _ := filepath.Glob("/sys/fs/cgroup/pids/runrecordd*/" + sid + "/cgroup.procs")
	if len(procs) != 1 {
		t.Fatalf("warm sandbox %s: cgroups %v", sid, procs)
	}
	b, err := os.ReadFile(procs[0])
	if err != nil {
		t.Fatal(err)
	}
	pids := strings.Fields(string(b))
	if len(pids) != 1 {
		t.Fatalf("warm sandbox %s holds processes %v, want the gate alone", sid, pids)
	}
	cmd, err := os.ReadFile("/proc/" + pids[0] + "/cmdline")
	if err != nil || !strings.HasPrefix(string(cmd), "/.runrecordd-gate\x00") {
		t.Fatalf("warm sandbox %s's process runs %q (%v), want the gate", sid, cmd, err)
	}
}

func TestWarmResume(t *testing.T) {
	privileged(t)
	d := mustDaemon(t, "warm")
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	const id = "warm-agent"
	trStart(t, d, id, trAgentImage, "STEPS=2", "WORK_ITERS=0")
	for n := 1; n <= 2; n++ {
		trParked(t, d, id, 3*n-1)
		m := warmReady(t, d, 1)
		sid := fmt.Sprintf("%s_t%d", id, n+1)
		if left := warmSandboxLeft(d, sid); len(left) == 0 {
			t.Fatalf("step %d: the pool says a sandbox is ready, and there is no cgroup or process of %s", n, sid)
		}
		warmGated(t, sid)
		pr := trPost(t, d, id, fmt.Sprintf("call-%d", n), trResult(n))
		in := pr.Resumed.Idle.Inputs
		if in["warm_pool_sandboxes"] != "1" || in["warm_pool_uj"] == "" || in["warm_pool"] == "" || in["warm_pool_resident_bytes"] == "0" {
			t.Fatalf("step %d: the resume's idle energy %+v has no warm-pool residency", n, pr.Resumed.Idle)
		}
		after := warmMetrics(t, d, "runrecordd_warm")
		if got := after[`runrecordd_warm_resumes_total{sandbox="warm"}`]; got != float64(n) {
			t.Fatalf("step %d: %v warm resumes counted, want %d (before: %v; after: %v)", n, got, n, m, after)
		}
		t.Logf("step %d: resumed from warm sandbox %s in %v; idle %d uJ (%s µJ of it the pool's, %s bytes held)",
			n, sid, time.Duration(pr.Resumed.DurationNS), pr.Resumed.Idle.UJ, in["warm_pool_uj"], in["warm_pool_resident_bytes"])
	}
	trClosed(t, d, id)
	s := mustShow(t, d, id)
	if last := s.Segments[len(s.Segments)-1]; last.Reason != "unit exited with code 0" {
		t.Fatalf("%s closed: %+v", id, last)
	}
	trCheckTranscript(t, d, s, trAgentTranscript(2))
	if err := verifyRun(context.Background(), d, id); err != nil {
		t.Fatal(err)
	}
	if m := warmMetrics(t, d, "runrecordd_warm_resumes_total"); m[`runrecordd_warm_resumes_total{sandbox="made"}`] != 0 {
		t.Fatalf("a resume made its sandbox: %v", m)
	}
}

func TestWarmPoolFull(t *testing.T) {
	privileged(t)
	d := mustDaemon(t, "warm-full", func(d *daemon) { d.flags = []string{"--warm-pool", "1"} })
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	trStart(t, d, "warm-a", trAgentImage, "STEPS=1", "WORK_ITERS=0")
	trParked(t, d, "warm-a", 2)
	warmReady(t, d, 1)
	trStart(t, d, "warm-b", trAgentImage, "STEPS=1", "WORK_ITERS=0")
	trParked(t, d, "warm-b", 2)
	m := warmReady(t, d, 1)
	if m[`runrecordd_warm_pool_total{outcome="refused"}`] != 1 || m["runrecordd_warm_pool_max"] != 1 {
		t.Fatalf("the full pool: %v, want one refused", m)
	}
	pr := trPost(t, d, "warm-b", "call-1", trResult(1))
	if _, ok := pr.Resumed.Idle.Inputs["warm_pool"]; ok {
		t.Fatalf("warm-b resumed with a residency it never had: %+v", pr.Resumed.Idle)
	}
	pr = trPost(t, d, "warm-a", "call-1", trResult(1))
	if pr.Resumed.Idle.Inputs["warm_pool_sandboxes"] != "1" {
		t.Fatalf("warm-a resumed without its warm sandbox: %+v", pr.Resumed.Idle)
	}
	for _, id := range []string{"warm-a", "warm-b"} {
		trClosed(t, d, id)
		trCheckTranscript(t, d, mustShow(t, d, id), trAgentTranscript(1))
	}
	m = warmMetrics(t, d, "runrecordd_warm_resumes_total")
	if m[`runrecordd_warm_resumes_total{sandbox="warm"}`] != 1 || m[`runrecordd_warm_resumes_total{sandbox="made"}`] != 1 {
		t.Fatalf("resumes: %v, want one warm and one made", m)
	}
}

func TestWarmRestart(t *testing.T) {
	privileged(t)
	d := mustDaemon(t, "warm-restart")
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	const id, sid = "warm-kill", "warm-kill_t2"
	trStart(t, d, id, trAgentImage, "STEPS=1", "WORK_ITERS=0")
	was := trParked(t, d, id, 2)
	warmReady(t, d, 1)
	chDir := filepath.Join(d.state, "ch", id)
	if _, err := os.Stat(chDir); err != nil || len(warmSandboxLeft(d, sid)) == 0 {
		t.Fatalf("no warm sandbox %s to leave behind (channel directory: %v)", sid, err)
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	d.cmd = nil
	mustStart(t, d)
	deadline := time.Now().Add(15 * time.Second)
	for left := warmSandboxLeft(d, sid); len(left) > 0; left = warmSandboxLeft(d, sid) {
		if time.Now().After(deadline) {
			t.Fatalf("after the restart the warm sandbox is left: %s", strings.Join(left, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(chDir); !os.IsNotExist(err) {
		t.Fatalf("after the restart the warm sandbox's channel directory is left (%v)", err)
	}
	if r, err := d.run(context.Background(), id); err != nil || r.Phase != "parked" || r.Head != was.Head {
		t.Fatalf("after the restart: %+v, %v; before %+v", r, err, was)
	}
	if m := warmMetrics(t, d, "runrecordd_warm_pool_sandboxes"); m[`runrecordd_warm_pool_sandboxes{state="ready"}`] != 0 {
		t.Fatalf("the restarted pool holds %v", m)
	}
	pr := trPost(t, d, id, "call-1", trResult(1))
	if _, ok := pr.Resumed.Idle.Inputs["warm_pool"]; ok {
		t.Fatalf("resumed after the restart with a residency: %+v", pr.Resumed.Idle)
	}
	trClosed(t, d, id)
	trCheckTranscript(t, d, mustShow(t, d, id), trAgentTranscript(1))
}

// warmGone waits until nothing is left of run id's warm sandbox sid and its
// channel directory.
func warmGone(t *testing.T, d *daemon, id, sid, what string) {
	t.Helper()
	chDir := filepath.Join(d.state, "ch", id)
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := warmSandboxLeft(d, sid)
		if _, err := os.Stat(chDir); err == nil {
			left = append(left, chDir)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the warm sandbox is left: %s", what, strings.Join(left, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestWarmDiscarded(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := mustDaemon(t, "warm-discard")
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	trStart(t, d, "warm-close", trAgentImage, "STEPS=1", "WORK_ITERS=0")
	trParked(t, d, "warm-close", 2)
	warmReady(t, d, 1)
	if _, err := d.c.Close(ctx, "warm-close", "e2e: closed with a warm sandbox"); err != nil {
		t.Fatal(err)
	}
	// The close discards it before it answers.
	if m := warmMetrics(t, d, "runrecordd_warm_pool"); m[`runrecordd_warm_pool_total{outcome="dropped"}`] != 1 ||
		m[`runrecordd_warm_pool_sandboxes{state="ready"}`]+m[`runrecordd_warm_pool_sandboxes{state="preparing"}`] != 0 {
		t.Fatalf("the pool once the close answered: %v", m)
	}
	if _, err := os.Stat(filepath.Join(d.state, "ch", "warm-close")); !os.IsNotExist(err) {
		t.Fatalf("the closed run's channel directory is left once the close answered (%v)", err)
	}
	warmGone(t, d, "warm-close", "warm-close_t2", "closed")

	trStart(t, d, "warm-export", trAgentImage, "STEPS=1", "WORK_ITERS=0")
	trParked(t, d, "warm-export", 2)
	warmReady(t, d, 1)
	var b bytes.Buffer
	if err := d.c.Export(ctx, "warm-export", &b); err != nil {
		t.Fatal(err)
	}
	warmGone(t, d, "warm-export", "warm-export_t2", "handed off")
	if m := warmMetrics(t, d, "runrecordd_warm_pool"); m[`runrecordd_warm_pool_total{outcome="dropped"}`] != 2 ||
		m[`runrecordd_warm_pool_sandboxes{state="ready"}`] != 0 {
		t.Fatalf("the pool after a close and a handoff: %v", m)
	}

	// A daemon stopped discards its warm sandboxes; the run, parked as
	// it was, resumes when its result is posted.
	trStart(t, d, "warm-stop", trAgentImage, "STEPS=1", "WORK_ITERS=0")
	trParked(t, d, "warm-stop", 2)
	warmReady(t, d, 1)
	mustStop(t, d)
	warmGone(t, d, "warm-stop", "warm-stop_t2", "the daemon stopped")
	mustStart(t, d)
	trPost(t, d, "warm-stop", "call-1", trResult(1))
	trClosed(t, d, "warm-stop")
}
