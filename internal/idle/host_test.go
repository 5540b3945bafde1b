package idle

// Tests on this host's real /proc and cgroup hierarchies. This CI host is
// cgroup v1 hybrid (v1 controllers under /sys/fs/cgroup, the unified
// hierarchy at /sys/fs/cgroup/unified) and has no RAPL; the tests meter
// whichever hierarchies the host has, and fail rather than skip under CI.

import (
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// burnEnv makes the test binary a child that waits for a byte on stdin,
// then burns the CPU time it names, then exits.
const burnEnv = "RUNRECORDD_IDLE_TEST_BURN"

func TestMain(m *testing.M) {
	if d := os.Getenv(burnEnv); d != "" {
		dur, err := time.ParseDuration(d)
		if err != nil {
			os.Exit(2)
		}
		var b [1]byte
		if _, err := os.Stdin.Read(b[:]); err != nil {
			os.Exit(3)
		}
		burn(dur)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var sink uint64

// burn spins until this process has used d more CPU time (not wall time:
// other tests may be running on the same CPUs), for at most 20 s.
func burn(d time.Duration) {
	x := uint64(1)
	start, deadline := processCPU(), time.Now().Add(20*time.Second)
	for processCPU()-start < d && time.Now().Before(deadline) {
		for range 10000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink += x
}

// processCPU is this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type hierarchy struct {
	mode CgroupMode
	root string // the meter's CgroupRoot
	dir  string // where a cgroup of this hierarchy is made: under root
}

// realHierarchies lists this host's cgroup hierarchies that hold CPU time.
func realHierarchies(t *testing.T) []hierarchy {
	t.Helper()
	var hs []hierarchy
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	if exists("/sys/fs/cgroup/cpuacct/cpuacct.usage") {
		hs = append(hs, hierarchy{CgroupV1, "/sys/fs/cgroup", "/sys/fs/cgroup/cpuacct"})
	}
	for _, r := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if exists(filepath.Join(r, "cgroup.controllers")) {
			hs = append(hs, hierarchy{CgroupV2, r, r})
			break
		}
	}
	if len(hs) == 0 {
		skipOrFail(t, "no cgroup v1 cpuacct or v2 hierarchy under /sys/fs/cgroup")
	}
	return hs
}

func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI: %s", why)
	}
	t.Skip(why)
}

// TestRealHostOwnCgroup reads this test process's own cgroup, found from
// /proc/self/cgroup, and checks its CPU time grows by at least what the
// process burned.
func TestRealHostOwnCgroup(t *testing.T) {
	for _, h := range realHierarchies(t) {
		t.Run(string(h.mode), func(t *testing.T) {
			m, err := NewMeter(Config{CgroupRoot: h.root, Cgroup: h.mode})
			if err != nil {
				t.Fatal(err)
			}
			path, err := m.CgroupOf(os.Getpid())
			if err != nil {
				t.Fatal(err)
			}
			iv, err := m.Begin(path)
			if err != nil {
				t.Fatal(err)
			}
			before := processCPU()
			burn(200 * time.Millisecond)
			self := processCPU() - before
			r, err := iv.End()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("cgroup %s:%s grew %s while this process used %s; receipt %d µJ %s (%s)",
				h.mode, path, time.Duration(r.CPUNS), self, r.UJ, r.Provenance, r.Inputs["fallback"])
			// The cgroup holds this process (and maybe more); allow a few
			// scheduler ticks of accounting lag.
			if time.Duration(r.CPUNS)+20*time.Millisecond < self || self < 200*time.Millisecond {
				t.Errorf("cgroup grew %s, process used %s", time.Duration(r.CPUNS), self)
			}
			checkHostReceipt(t, m, r.Provenance, r.Inputs["fallback"])
		})
	}
}

// checkHostReceipt: on a host with RAPL the receipt is measured; on one
// without (this CI host) it is estimated and says why.
func checkHostReceipt(t *testing.T, m *Meter, prov record.Provenance, fallback string) {
	t.Helper()
	s := m.Snapshot()
	checkSnapshot(t, s)
	if s.Available {
		if prov != record.Measured {
			t.Errorf("RAPL available but receipt %s: %s", prov, fallback)
		}
		return
	}
	if prov != record.Estimated || fallback == "" {
		t.Errorf("no RAPL (%q) but receipt %s, fallback %q", s.Reasons, prov, fallback)
	}
	if len(s.Zones) == 0 {
		mustContain(t, "fallback", fallback, "rapl unavailable: ", s.Reasons[0])
	}
}

// TestRealHostChildCgroup makes a cgroup in each real hierarchy, moves a
// child process that burns 300 ms of CPU into them, and meters it three
// ways: through each real hierarchy with this host's sysfs, and through
// v1 with a RAPL tree from testdata beside the real /proc, so the measured
// share is computed from real CPU times.
func TestRealHostChildCgroup(t *testing.T) {
	hs := realHierarchies(t)
	name := fmt.Sprintf("runrecordd-idle-test-%d", os.Getpid())
	for _, h := range hs {
		dir := filepath.Join(h.dir, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			skipOrFail(t, fmt.Sprintf("cannot make a cgroup (needs root): %v", err))
		}
		t.Cleanup(func() {
			if err := os.Remove(dir); err != nil {
				t.Errorf("remove cgroup: %v", err)
			}
		})
	}

	const burnFor = 300 * time.Millisecond
	child := exec.Command(os.Args[0], "-test.run=^$")
	// GORACE: a race-enabled child otherwise sleeps a second at exit.
	child.Env = append(os.Environ(), burnEnv+"="+burnFor.String(), "GORACE=atexit_sleep_ms=0")
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})

	type metered struct {
		label string
		m     *Meter
		iv    *Interval
	}
	var ms []metered
	fake := mustHost(t, "two-socket")
	for _, h := range hs {
		procs := filepath.Join(h.dir, name, "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(child.Process.Pid)), 0o644); err != nil {
			t.Fatalf("move child into %s: %v", procs, err)
		}
		m, err := NewMeter(Config{CgroupRoot: h.root, Cgroup: h.mode})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, metered{label: string(h.mode), m: m})
		if h.mode == CgroupV1 {
			m, err := NewMeter(Config{SysfsRoot: filepath.Join(fake, "sys"), CgroupRoot: h.root, Cgroup: h.mode})
			if err != nil {
				t.Fatal(err)
			}
			ms = append(ms, metered{label: "v1 with testdata RAPL", m: m})
		}
	}
	for i := range ms {
		path, err := ms[i].m.CgroupOf(child.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if path != "/"+name {
			t.Fatalf("%s: child in %q, want /%s", ms[i].label, path, name)
		}
		if ms[i].iv, err = ms[i].m.Begin(path); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if _, err := stdin.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	err = child.Wait()
	waited = true
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	window := time.Since(start)
	setEnergy(t, fake, "intel-rapl:0", 100000000+10000000) // 10 J on package 0

	var cpus []uint64
	for _, x := range ms {
		r, err := x.iv.End()
		if err != nil {
			t.Fatal(err)
		}
		cpu := time.Duration(r.CPUNS)
		t.Logf("%s: child used %s in %s; receipt %d µJ %s %s %q", x.label, cpu, window, r.UJ, r.Provenance, r.Method, r.Inputs)
		if cpu < burnFor || cpu > time.Duration(r.WindowNS)*time.Duration(runtime.NumCPU()) {
			t.Errorf("%s: child cgroup grew %s for a %s burn", x.label, cpu, burnFor)
		}
		cpus = append(cpus, r.CPUNS)
		if x.label != "v1 with testdata RAPL" {
			checkHostReceipt(t, x.m, r.Provenance, r.Inputs["fallback"])
			continue
		}
		// Measured from the testdata counters and this host's real CPU times.
		if r.Provenance != record.Measured || r.Inputs["rapl_uj"] != "10000000" {
			t.Fatalf("%s: %+v", x.label, r)
		}
		host, _ := strconv.ParseUint(r.Inputs["host_busy_ns"], 10, 64)
		want := uint64(10000000)
		if r.CPUNS < host {
			q := new(big.Rat).SetFrac(new(big.Int).SetUint64(10000000*r.CPUNS), new(big.Int).SetUint64(host))
			want, _ = ceilUJ(q)
		}
		if r.UJ != want || r.UJ == 0 {
			t.Errorf("%s: %d µJ, want 10 J × %d/%d = %d", x.label, r.UJ, r.CPUNS, host, want)
		}
	}
	if len(cpus) == 3 {
		d := int64(cpus[0]) - int64(cpus[2])
		if d < -int64(30*time.Millisecond) || d > int64(30*time.Millisecond) {
			t.Errorf("v1 says %s, v2 says %s", time.Duration(cpus[0]), time.Duration(cpus[2]))
		}
	}
}
