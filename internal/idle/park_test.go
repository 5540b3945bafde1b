package idle

import (
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// memTotal is host.txtar's MemTotal: 16384000 kB.
const memTotal = 16384000 * 1024

func TestParkMeasuresResidentDRAM(t *testing.T) {
	root := mustHost(t, "two-socket")
	m := mustMeter(t, root, CgroupV1)
	clock := withClock(m)

	p := m.BeginPark()
	clock.Advance(30 * time.Second)
	m.Sample()
	setEnergy(t, root, "intel-rapl:0:1", 20000000+600000)
	setEnergy(t, root, "intel-rapl:1:0", 30000000+400000)
	setEnergy(t, root, "intel-rapl:0", 900000000) // package energy is not DRAM's
	clock.Advance(30 * time.Second)

	// A quarter of memory resident, nothing stored: measured.
	uj, prov, in := p.End(0, memTotal/4)
	if prov != record.Measured || uj != 250000 || in["method"] != MethodIdleDRAMShare {
		t.Fatalf("%d %s %q", uj, prov, in)
	}
	for k, v := range map[string]string{
		"dram": "measured", "dram_rapl_uj": "1000000", "mem_total_bytes": "16777216000",
		"rapl_zones": "intel-rapl:0:1=dram-0,intel-rapl:1:0=dram-1", "parked_ns": "60000000000",
	} {
		if in[k] != v {
			t.Errorf("input %s = %q, want %q", k, in[k], v)
		}
	}

	// The same with bytes stored too: storage is estimated, so the figure is.
	uj, prov, in = p.End(1e9, memTotal/4)
	want := uint64(250000 + 72000) // 1e9 B × 1.2e-6 µJ/B·s × 60 s
	if prov != record.Estimated || uj != want || in["dram"] != "measured" || in["method"] != MethodIdleCoefficient {
		t.Fatalf("%d (want %d) %s %q", uj, want, prov, in)
	}

	// Nothing resident: the estimate alone.
	uj, prov, _ = p.End(1e9, 0)
	if e, _, _ := Estimate(1e9, 0, time.Minute, DefaultCoefficients()); prov != record.Estimated || uj != e {
		t.Fatalf("%d %s, want %d", uj, prov, e)
	}

	// A DRAM counter that did not move still charges the resident bytes.
	p = m.BeginPark()
	clock.Advance(time.Second)
	if uj, prov, in = p.End(0, 1); uj != 1 || prov != record.Measured || in["floor"] != "1" {
		t.Fatalf("floor: %d %s %q", uj, prov, in)
	}
}

func TestParkFallsBack(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"package-only", "no RAPL DRAM zone"},
		{"no-rapl", "rapl unavailable: powercap"},
		{"energy-dir", "rapl unreadable at start: zone intel-rapl:0:1=dram-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := mustHost(t, tc.name)
			m := mustMeter(t, root, CgroupV1)
			clock := withClock(m)
			p := m.BeginPark()
			clock.Advance(time.Hour)
			uj, prov, in := p.End(0, 1e9)
			if e, _, _ := Estimate(0, 1e9, time.Hour, DefaultCoefficients()); prov != record.Estimated || uj != e {
				t.Fatalf("%d %s %q, want %d", uj, prov, in, e)
			}
			mustContain(t, "fallback", in["fallback"], tc.want)
			if in["dram"] != "estimated" {
				t.Errorf("dram %q", in["dram"])
			}
		})
	}
}
