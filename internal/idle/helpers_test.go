package idle

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/txtar"
)

// mustHost extracts testdata/host.txtar and testdata/rapl/<raplCase>.txtar
// into one temporary root: root/sys, root/proc, root/cgroup-v1,
// root/cgroup-v2.
func mustHost(t *testing.T, raplCase string) string {
	t.Helper()
	root := t.TempDir()
	extract(t, filepath.Join("testdata", "host.txtar"), root)
	extract(t, filepath.Join("testdata", "rapl", raplCase+".txtar"), root)
	return root
}

func extract(t *testing.T, archive, root string) {
	t.Helper()
	a, err := txtar.ParseFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Files) == 0 {
		t.Fatalf("%s: no files", archive)
	}
	for _, f := range a.Files {
		p := filepath.Join(root, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// mustMeter opens a meter on an extracted host tree, reading cgroup-v1 or
// cgroup-v2 by mode. Its cleanup checks the snapshot's invariants.
func mustMeter(t *testing.T, root string, mode CgroupMode, opts ...func(*Config)) *Meter {
	t.Helper()
	cfg := Config{
		SysfsRoot:  filepath.Join(root, "sys"),
		ProcfsRoot: filepath.Join(root, "proc"),
		CgroupRoot: filepath.Join(root, "cgroup-"+string(mode)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := NewMeter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkSnapshot(t, m.Snapshot()) })
	return m
}

// checkSnapshot checks what every snapshot must satisfy.
func checkSnapshot(t *testing.T, s Snapshot) {
	t.Helper()
	if s.Available != (len(s.Reasons) == 0) {
		t.Errorf("snapshot: available %v with reasons %q", s.Available, s.Reasons)
	}
	for _, z := range s.Zones {
		if z.Err != "" && !slices.Contains(s.Reasons, z.Err) {
			t.Errorf("snapshot: zone %s error %q not among reasons", z.ID, z.Err)
		}
		if z.Domain != domainPackage && z.Domain != domainDRAM {
			t.Errorf("snapshot: zone %s in domain %q", z.ID, z.Domain)
		}
		if z.Err != "" && z.Faults == 0 {
			t.Errorf("snapshot: zone %s failing without a fault counted", z.ID)
		}
	}
	if len(s.Zones) == 0 && s.Available {
		t.Error("snapshot: available without zones")
	}
}

// put replaces a file's content the way sysfs shows it: whole. It writes a
// temporary file and renames it over the old, so a concurrent reader sees
// the old value or the new, never half of one.
func put(t *testing.T, path string, v any) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintln(v)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func zoneFile(root, id string) string {
	return filepath.Join(root, "sys", "class", "powercap", id, "energy_uj")
}

// setEnergy sets a zone's energy_uj.
func setEnergy(t *testing.T, root, id string, uj uint64) { put(t, zoneFile(root, id), uj) }

// setHostBusy rewrites proc/stat so that the host's busy time is busy
// (in 10 ms ticks), split between user and system.
func setHostBusy(t *testing.T, root string, ticks uint64) {
	t.Helper()
	user, system := ticks-ticks/4, ticks/4
	stat := fmt.Sprintf("cpu  %d 0 %d 974995 591 0 0 0 0 0\ncpu0 %d 0 %d 487409 90 0 0 0 0 0\nbtime 1764000000\n",
		user, system, user, system)
	tmp := filepath.Join(root, "proc", "stat.tmp")
	if err := os.WriteFile(tmp, []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(root, "proc", "stat")); err != nil {
		t.Fatal(err)
	}
}

// setCgroupNS sets unit-a's CPU time in the tree of mode.
func setCgroupNS(t *testing.T, root string, mode CgroupMode, ns uint64) {
	t.Helper()
	if mode == CgroupV1 {
		put(t, filepath.Join(root, "cgroup-v1", "cpuacct", "runrecordd", "unit-a", "cpuacct.usage"), ns)
		return
	}
	put(t, filepath.Join(root, "cgroup-v2", "runrecordd", "unit-a", "cpu.stat"),
		fmt.Sprintf("usage_usec %d\nuser_usec %d\nsystem_usec 0", ns/1000, ns/1000))
}

const unitA = "/runrecordd/unit-a"

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// withClock gives m a fake clock starting now. Call it before m is shared.
func withClock(m *Meter) *fakeClock {
	c := &fakeClock{now: time.Now()}
	m.mu.Lock()
	m.now = c.Now
	m.lastSample = time.Time{}
	m.mu.Unlock()
	return c
}

func mustContain(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s %q does not contain %q", what, s, sub)
		}
	}
}
