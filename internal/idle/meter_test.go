package idle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

const (
	pkgRange  = 262143328850 // max_energy_range_uj of the package zones in testdata
	dramRange = 65712999613  // and of the DRAM zones
)

func TestDiscoverTwoSocket(t *testing.T) {
	m := mustMeter(t, mustHost(t, "two-socket"), CgroupV1)
	s := m.Snapshot()
	if !s.Available || len(s.Reasons) != 0 {
		t.Fatalf("available %v, reasons %q", s.Available, s.Reasons)
	}
	var got []string
	for _, z := range s.Zones {
		got = append(got, z.ID+"="+z.Name+"/"+z.Domain)
	}
	// core (inside the package), psys (covers everything), the control
	// type directory and the mmio duplicate of package 0 are left out.
	want := []string{
		"intel-rapl:0=package-0/package",
		"intel-rapl:0:1=dram-0/dram",
		"intel-rapl:1=package-1/package",
		"intel-rapl:1:0=dram-1/dram",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("zones %q, want %q", got, want)
	}
	if s.Zones[0].RangeUJ != pkgRange || s.Zones[1].RangeUJ != dramRange {
		t.Errorf("ranges %d %d", s.Zones[0].RangeUJ, s.Zones[1].RangeUJ)
	}
	if s.Samples != 1 || s.Cgroup != CgroupV1 || s.Coefficients != DefaultCoefficients() {
		t.Errorf("samples %d, cgroup %q, coefficients %+v", s.Samples, s.Cgroup, s.Coefficients)
	}
}

// TestWrapDuringInterval wraps package 0's counter between two samples
// inside an interval, and checks the receipt counts every microjoule.
func TestWrapDuringInterval(t *testing.T) {
	root := mustHost(t, "two-socket")
	setHostBusy(t, root, 40000)
	setCgroupNS(t, root, CgroupV1, 1e9)
	m := mustMeter(t, root, CgroupV1)

	setEnergy(t, root, "intel-rapl:0", pkgRange-328850)
	m.Sample()
	iv, err := m.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	setEnergy(t, root, "intel-rapl:0", 500000) // wrapped: +328850 +500000
	m.Sample()
	setEnergy(t, root, "intel-rapl:0", 1500000)    // +1000000
	setEnergy(t, root, "intel-rapl:1", 202000000)  // +2000000
	setEnergy(t, root, "intel-rapl:0:1", 20001000) // dram-0 +1000
	// Zones the meter must not add: core, psys and the mmio duplicate.
	setEnergy(t, root, "intel-rapl:0:0", 99999999)
	setEnergy(t, root, "intel-rapl:2", 999999999)
	setEnergy(t, root, "intel-rapl-mmio:0", 1500000)
	setHostBusy(t, root, 40000+400)     // host busy +4 s
	setCgroupNS(t, root, CgroupV1, 3e9) // sandbox +2 s

	r, err := iv.End()
	if err != nil {
		t.Fatal(err)
	}
	const energy = 328850 + 500000 + 1000000 + 2000000 + 1000
	if r.Provenance != record.Measured || r.Method != MethodRAPLShare {
		t.Fatalf("receipt %+v", r)
	}
	if r.UJ != energy/2 || r.CPUNS != 2e9 {
		t.Errorf("uj %d cpu %d, want %d and 2e9", r.UJ, r.CPUNS, energy/2)
	}
	wantIn := map[string]string{
		"cgroup":           "v1:" + unitA,
		"rapl_zones":       "intel-rapl:0=package-0,intel-rapl:0:1=dram-0,intel-rapl:1=package-1,intel-rapl:1:0=dram-1",
		"rapl_uj":          strconv.Itoa(energy),
		"host_busy_ns":     "4000000000",
		"host_busy_fields": HostBusyFields,
	}
	for k, v := range wantIn {
		if r.Inputs[k] != v {
			t.Errorf("input %s = %q, want %q", k, r.Inputs[k], v)
		}
	}
	if len(r.Inputs) != len(wantIn) {
		t.Errorf("inputs %q", r.Inputs)
	}
	if _, err := r.Canonical(); err != nil {
		t.Fatal(err)
	}
	s := m.Snapshot()
	if s.Zones[0].Wraps != 1 || s.Zones[0].TotalUJ != pkgRange-328850-100000000+328850+1500000 {
		t.Errorf("zone 0: %+v", s.Zones[0])
	}
	if s.MeasuredReceipts != 1 || s.EstimatedReceipts != 0 {
		t.Errorf("receipts %d/%d", s.MeasuredReceipts, s.EstimatedReceipts)
	}
}

// TestRunSamplesThroughWraps lets the sampler goroutine see three wraps of
// package 0 during one interval, each between two of its own samples.
func TestRunSamplesThroughWraps(t *testing.T) {
	root := mustHost(t, "two-socket")
	m := mustMeter(t, root, CgroupV1, func(c *Config) { c.Period = time.Millisecond; c.MaxGap = time.Minute })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	iv, err := m.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	waitTotal := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.Snapshot().Zones[0].TotalUJ != want {
			if time.Now().After(deadline) {
				t.Fatalf("zone 0 total %d, want %d", m.Snapshot().Zones[0].TotalUJ, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	start := m.Snapshot().Zones[0].TotalUJ
	var energy uint64
	last := uint64(100000000)
	for range 3 {
		high := uint64(pkgRange - 1000)
		setEnergy(t, root, "intel-rapl:0", high)
		energy += high - last
		waitTotal(start + energy)
		setEnergy(t, root, "intel-rapl:0", 4000)
		energy += 1000 + 4000
		waitTotal(start + energy)
		last = 4000
	}
	setCgroupNS(t, root, CgroupV1, 2e9)
	setHostBusy(t, root, 40192+100) // the sandbox had all of it
	r, err := iv.End()
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v", err)
	}
	if r.Provenance != record.Measured || r.Inputs["rapl_uj"] != strconv.FormatUint(energy, 10) {
		t.Fatalf("receipt %+v, want rapl_uj %d", r, energy)
	}
	if r.UJ != energy || r.Inputs["cpu_share_capped"] != "true" {
		t.Errorf("uj %d (capped %q), want %d", r.UJ, r.Inputs["cpu_share_capped"], energy)
	}
	if w := m.Snapshot().Zones[0].Wraps; w != 3 {
		t.Errorf("wraps %d", w)
	}
}

func estimatedUJ(cpuNS uint64) uint64 {
	// ⌈cpu × 4.24 W⌉ in µJ: ns × 4.24 / 1000 = ns × 424 / 100000.
	return (cpuNS*424 + 99999) / 100000
}

// TestUnreadableCounter: a counter that cannot be read, though the file
// tree is readable by root, falls back to estimation naming the reason.
func TestUnreadableCounter(t *testing.T) {
	for _, tc := range []struct{ name, zone, want string }{
		{"energy-dir", "intel-rapl:0:1=dram-0", "is a directory"},
		{"energy-garbage", "intel-rapl:0=package-0", "invalid syntax"},
		{"energy-missing", "intel-rapl:0=package-0", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := mustHost(t, tc.name)
			m := mustMeter(t, root, CgroupV1)
			s := m.Snapshot()
			if s.Available || len(s.Reasons) != 1 {
				t.Fatalf("available %v, reasons %q", s.Available, s.Reasons)
			}
			mustContain(t, "reason", s.Reasons[0], tc.zone, tc.want)
			iv, err := m.Begin(unitA)
			if err != nil {
				t.Fatal(err)
			}
			setCgroupNS(t, root, CgroupV1, 1e9+123456789)
			r, err := iv.End()
			if err != nil {
				t.Fatal(err)
			}
			if r.Provenance != record.Estimated || r.Method != MethodCPUCoefficient {
				t.Fatalf("receipt %+v", r)
			}
			mustContain(t, "fallback", r.Inputs["fallback"], "rapl unreadable at start", tc.zone, tc.want)
			if r.UJ != estimatedUJ(123456789) || r.CPUNS != 123456789 || r.Inputs["cpu_watts"] != "4.24" {
				t.Errorf("uj %d cpu %d inputs %q", r.UJ, r.CPUNS, r.Inputs)
			}
			if s := m.Snapshot(); s.EstimatedReceipts != 1 || s.LastFallback != r.Inputs["fallback"] {
				t.Errorf("snapshot %+v", s)
			}
		})
	}
}

// TestHostWithoutRAPL: no powercap class, a class procfs refuses, or no
// package zone. Every receipt is estimated with the reason.
func TestHostWithoutRAPL(t *testing.T) {
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"no-rapl", []string{"powercap", "class/powercap", "no such file"}},
		{"no-range", []string{"powercap", "max_energy_range_uj"}},
		{"psys-only", []string{"no RAPL package zone", "intel-rapl:0=psys-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := mustHost(t, tc.name)
			m := mustMeter(t, root, CgroupV2)
			s := m.Snapshot()
			if s.Available || len(s.Zones) != 0 || len(s.Reasons) != 1 || s.Samples != 0 {
				t.Fatalf("snapshot %+v", s)
			}
			mustContain(t, "reason", s.Reasons[0], tc.want...)
			iv, err := m.Begin(unitA)
			if err != nil {
				t.Fatal(err)
			}
			setCgroupNS(t, root, CgroupV2, 1e9+5e8)
			r, err := iv.End()
			if err != nil {
				t.Fatal(err)
			}
			if r.Provenance != record.Estimated || r.CPUNS != 5e8 || r.UJ != 2120000 {
				t.Fatalf("receipt %+v", r)
			}
			mustContain(t, "fallback", r.Inputs["fallback"], "rapl unavailable: "+s.Reasons[0])
		})
	}
}

// TestFaultDuringInterval: a zone unreadable for one sample taints the
// interval across it, not the one after.
func TestFaultDuringInterval(t *testing.T) {
	root := mustHost(t, "two-socket")
	m := mustMeter(t, root, CgroupV1)
	iv, err := m.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	f := zoneFile(root, "intel-rapl:1:0")
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f, 0o755); err != nil {
		t.Fatal(err)
	}
	m.Sample()
	if s := m.Snapshot(); s.Available || s.Zones[3].Faults != 1 {
		t.Fatalf("snapshot %+v", s)
	}
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	setEnergy(t, root, "intel-rapl:1:0", 30000000)
	r, err := iv.End()
	if err != nil {
		t.Fatal(err)
	}
	if r.Provenance != record.Estimated {
		t.Fatalf("receipt %+v", r)
	}
	mustContain(t, "fallback", r.Inputs["fallback"], "rapl fault during the interval (1)", "intel-rapl:1:0=dram-1", "is a directory")

	iv, err = m.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	setHostBusy(t, root, 40192+100)
	setCgroupNS(t, root, CgroupV1, 1.25e9)
	setEnergy(t, root, "intel-rapl:0", 100000000+4000000)
	if r, err = iv.End(); err != nil {
		t.Fatal(err)
	}
	if r.Provenance != record.Measured || r.UJ != 1000000 {
		t.Fatalf("after recovery: %+v", r)
	}
	s := m.Snapshot()
	if !s.Available || s.Zones[3].Err != "" || s.Zones[3].Faults != 1 {
		t.Errorf("snapshot %+v", s)
	}
	mustContain(t, "last fault", s.Zones[3].LastFault, "is a directory")
}

// TestSampleGap: an interval across a gap between samples longer than
// MaxGap is estimated; with samples every Period it is measured.
func TestSampleGap(t *testing.T) {
	root := mustHost(t, "two-socket")
	m := mustMeter(t, root, CgroupV1, func(c *Config) { c.Period = 10 * time.Second })
	clock := withClock(m)
	iv, err := m.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(61 * time.Second)
	r, err := iv.End()
	if err != nil {
		t.Fatal(err)
	}
	if r.Provenance != record.Estimated || r.WindowNS != uint64(61*time.Second) {
		t.Fatalf("receipt %+v", r)
	}
	mustContain(t, "fallback", r.Inputs["fallback"], "no sample for 1m1s (max gap 1m0s)")

	if iv, err = m.Begin(unitA); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		clock.Advance(10 * time.Second)
		m.Sample()
	}
	clock.Advance(time.Second)
	if r, err = iv.End(); err != nil {
		t.Fatal(err)
	}
	if r.Provenance != record.Measured || r.WindowNS != uint64(61*time.Second) {
		t.Fatalf("receipt %+v", r)
	}
}

func TestShareEdges(t *testing.T) {
	root := mustHost(t, "package-only")
	m := mustMeter(t, root, CgroupV1)

	// The sandbox used no CPU: none of the energy is its.
	iv, _ := m.Begin(unitA)
	setEnergy(t, root, "intel-rapl:0", 6000000)
	setHostBusy(t, root, 40192+50)
	r, err := iv.End()
	if err != nil || r.Provenance != record.Measured || r.UJ != 0 {
		t.Fatalf("idle sandbox: %+v %v", r, err)
	}
	if r.Inputs["rapl_zones"] != "intel-rapl:0=package-0" {
		t.Errorf("zones %q", r.Inputs["rapl_zones"])
	}

	// A third of the host's busy time: the share rounds up.
	iv, _ = m.Begin(unitA)
	setEnergy(t, root, "intel-rapl:0", 6000100)
	setHostBusy(t, root, 40192+50+300)
	setCgroupNS(t, root, CgroupV1, 2e9)
	if r, err = iv.End(); err != nil || r.UJ != 34 { // ⌈100/3⌉
		t.Fatalf("third: %+v %v", r, err)
	}

	// The host's ticks did not move: the share is capped at all of it.
	iv, _ = m.Begin(unitA)
	setEnergy(t, root, "intel-rapl:0", 6000200)
	setCgroupNS(t, root, CgroupV1, 2e9+1)
	if r, err = iv.End(); err != nil || r.UJ != 100 || r.Inputs["cpu_share_capped"] != "true" {
		t.Fatalf("capped: %+v %v", r, err)
	}

	// /proc/stat unreadable at the end: estimated.
	iv, _ = m.Begin(unitA)
	if err := os.Remove(filepath.Join(root, "proc", "stat")); err != nil {
		t.Fatal(err)
	}
	setCgroupNS(t, root, CgroupV1, 3e9+1)
	if r, err = iv.End(); err != nil || r.Provenance != record.Estimated {
		t.Fatalf("no stat: %+v %v", r, err)
	}
	mustContain(t, "fallback", r.Inputs["fallback"], "host cpu time", "stat")
}

func TestCgroupV2(t *testing.T) {
	root := mustHost(t, "package-only")
	m := mustMeter(t, root, CgroupAuto, func(c *Config) { c.CgroupRoot = filepath.Join(root, "cgroup-v2") })
	if m.mode != CgroupV2 {
		t.Fatalf("mode %q", m.mode)
	}
	iv, err := m.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	setCgroupNS(t, root, CgroupV2, 2.5e9)
	setHostBusy(t, root, 40192+300)
	setEnergy(t, root, "intel-rapl:0", 5000000+900000)
	r, err := iv.End()
	if err != nil {
		t.Fatal(err)
	}
	if r.CPUNS != 1.5e9 || r.UJ != 450000 || r.Inputs["cgroup"] != "v2:"+unitA {
		t.Fatalf("receipt %+v", r)
	}
}

func TestCgroupAutoV1(t *testing.T) {
	root := mustHost(t, "no-rapl")
	m := mustMeter(t, root, CgroupAuto, func(c *Config) { c.CgroupRoot = filepath.Join(root, "cgroup-v1") })
	if m.mode != CgroupV1 {
		t.Fatalf("mode %q", m.mode)
	}
}

func TestCgroupOf(t *testing.T) {
	root := mustHost(t, "no-rapl")
	v1 := mustMeter(t, root, CgroupV1)
	v2 := mustMeter(t, root, CgroupV2)
	for _, tc := range []struct {
		m    *Meter
		pid  int
		want string
	}{
		{v1, 4242, unitA},
		{v2, 4242, "/system.slice/containerd.service"},
		{v2, 4243, unitA},
	} {
		got, err := tc.m.CgroupOf(tc.pid)
		if err != nil || got != tc.want {
			t.Errorf("%s CgroupOf(%d) = %q, %v; want %q", tc.m.mode, tc.pid, got, err, tc.want)
		}
	}
	if _, err := v1.CgroupOf(4243); !errors.Is(err, ErrCgroup) {
		t.Errorf("v1 of a v2-only process: %v", err)
	}
	if _, err := v1.CgroupOf(9999); !errors.Is(err, ErrCgroup) {
		t.Errorf("no such process: %v", err)
	}
}

func TestIntervalErrors(t *testing.T) {
	root := mustHost(t, "no-rapl")
	m := mustMeter(t, root, CgroupV1)
	for _, p := range []string{"/runrecordd/unit-b", "/runrecordd/../../etc", "../x"} {
		if _, err := m.Begin(p); !errors.Is(err, ErrCgroup) {
			t.Errorf("Begin(%q): %v", p, err)
		}
	}

	iv, err := m.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "cgroup-v1", "cpuacct", "runrecordd", "unit-a", "cpuacct.usage")
	if err := os.Rename(file, file+".away"); err != nil {
		t.Fatal(err)
	}
	if _, err := iv.End(); !errors.Is(err, ErrCgroup) {
		t.Fatalf("End without the cgroup: %v", err)
	}
	if err := os.Rename(file+".away", file); err != nil {
		t.Fatal(err)
	}
	if _, err := iv.End(); err != nil { // still open
		t.Fatalf("End again: %v", err)
	}
	if _, err := iv.End(); !errors.Is(err, ErrEnded) {
		t.Fatalf("End twice: %v", err)
	}

	iv, _ = m.Begin(unitA)
	setCgroupNS(t, root, CgroupV1, 5)
	if _, err := iv.End(); !errors.Is(err, ErrCgroup) {
		t.Fatalf("counter went backwards: %v", err)
	}
	put(t, file, "garbage")
	if _, err := m.Begin(unitA); !errors.Is(err, ErrCgroup) {
		t.Fatalf("garbage usage: %v", err)
	}
}

func TestNewMeterConfig(t *testing.T) {
	root := mustHost(t, "no-rapl")
	base := Config{
		SysfsRoot:  filepath.Join(root, "sys"),
		ProcfsRoot: filepath.Join(root, "proc"),
		CgroupRoot: filepath.Join(root, "cgroup-v1"),
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want error
	}{
		{"no hierarchy", func(c *Config) { c.CgroupRoot = root }, ErrCgroup},
		{"unknown mode", func(c *Config) { c.Cgroup = "v3" }, ErrCgroup},
		{"no procfs", func(c *Config) { c.ProcfsRoot = filepath.Join(root, "nope") }, ErrConfig},
		{"gap under period", func(c *Config) { c.Period = time.Minute; c.MaxGap = time.Second }, ErrConfig},
		{"negative period", func(c *Config) { c.Period = -time.Second }, ErrConfig},
		{"bad coefficient", func(c *Config) { c.Coefficients = Coefficients{CPUWatts: 1, StorageWattsPerTB: -1, DRAMWattsPerGB: 1} }, ErrCoefficients},
	} {
		cfg := base
		tc.edit(&cfg)
		if _, err := NewMeter(cfg); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	m, err := NewMeter(base)
	if err != nil {
		t.Fatal(err)
	}
	s := m.Snapshot()
	if s.Period != DefaultPeriod || s.MaxGap != DefaultMaxGapPeriods*DefaultPeriod || m.Coefficients() != DefaultCoefficients() {
		t.Errorf("defaults: %+v", s)
	}
}

// TestReceiptsRoundTrip: every receipt the meter makes has canonical bytes
// that decode to it.
func TestReceiptsRoundTrip(t *testing.T) {
	for _, c := range []string{"two-socket", "energy-dir", "no-rapl"} {
		root := mustHost(t, c)
		m := mustMeter(t, root, CgroupV1)
		iv, _ := m.Begin(unitA)
		setCgroupNS(t, root, CgroupV1, 4e9)
		setHostBusy(t, root, 50000)
		r, err := iv.End()
		if err != nil {
			t.Fatal(err)
		}
		b, err := r.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		back, err := attest.DecodeReceipt(b)
		if err != nil {
			t.Fatal(err)
		}
		if back.UJ != r.UJ || back.Provenance != r.Provenance || len(back.Inputs) != len(r.Inputs) {
			t.Errorf("%s: %+v != %+v", c, back, r)
		}
	}
}
