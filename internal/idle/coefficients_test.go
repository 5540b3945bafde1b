package idle

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestEstimateExact(t *testing.T) {
	ssd, hdd := DefaultCoefficients(), DefaultCoefficients()
	hdd.StorageWattsPerTB = HDDWattsPerTB
	for _, tc := range []struct {
		name               string
		retained, resident uint64
		parked             time.Duration
		c                  Coefficients
		want               uint64
	}{
		// 1 TB on SSD for an hour: 1.2 Wh = 4320 J.
		{"TB-hour ssd", 1e12, 0, time.Hour, ssd, 4_320_000_000},
		// On HDD: 0.65 Wh = 2340 J.
		{"TB-hour hdd", 1e12, 0, time.Hour, hdd, 2_340_000_000},
		// 1 GB resident for a second: 0.392 J.
		{"GB-second dram", 0, 1e9, time.Second, ssd, 392_000},
		// 5 GB stored and 2 GB resident for ten minutes:
		// 5e9 × 1.2e-6 × 600 + 2e9 × 3.92e-4 × 600 = 3.6e6 + 4.704e8 µJ.
		{"both", 5e9, 2e9, 10 * time.Minute, ssd, 474_000_000},
		// A 64 KiB transcript for a week: 65536 × 1.2e-6 × 604800 = 47563.1…
		{"transcript week", 65536, 0, 7 * 24 * time.Hour, ssd, 47564},
		// Tiny parks round up and are never zero.
		{"byte-nanosecond", 1, 0, time.Nanosecond, ssd, 1},
		{"KB-second", 1000, 0, time.Second, ssd, 1},
		{"resident byte-nanosecond", 0, 1, time.Nanosecond, ssd, 1},
		// Nothing kept, or no time: zero.
		{"nothing", 0, 0, time.Hour, ssd, 0},
		{"no time", 1e9, 1e9, 0, ssd, 0},
		{"negative time", 1e9, 0, -time.Second, ssd, 0},
	} {
		uj, prov, in := Estimate(tc.retained, tc.resident, tc.parked, tc.c)
		if uj != tc.want || prov != record.Estimated {
			t.Errorf("%s: %d %s, want %d estimated", tc.name, uj, prov, tc.want)
		}
		if in["method"] != MethodIdleCoefficient || in["retained_bytes"] != fmt.Sprint(tc.retained) ||
			in["resident_bytes"] != fmt.Sprint(tc.resident) || in["parked_ns"] != fmt.Sprint(durationNS(tc.parked)) {
			t.Errorf("%s: inputs %q", tc.name, in)
		}
		if (tc.retained > 0) != (in["storage_watts_per_tb"] != "") || (tc.resident > 0) != (in["dram_watts_per_gb"] != "") {
			t.Errorf("%s: coefficient inputs %q", tc.name, in)
		}
	}
}

// TestEstimateMatchesFormula: for any bytes and time, the estimate is
// bytes × coefficient × time rounded up, and never zero.
func TestEstimateMatchesFormula(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := DefaultCoefficients()
	for range 10000 {
		retained := rng.Uint64N(1<<44) + 1 // up to 16 TiB
		resident := uint64(0)
		if rng.IntN(2) == 0 {
			resident = rng.Uint64N(1 << 38)
		}
		parked := time.Duration(rng.Int64N(int64(30*24*time.Hour))) + 1
		uj, _, _ := Estimate(retained, resident, parked, c)
		s := parked.Seconds()
		f := float64(retained)*c.StorageWattsPerTB*1e-6*s + float64(resident)*c.DRAMWattsPerGB*1e-3*s
		if uj == 0 {
			t.Fatalf("%d B, %d B resident, %s: zero", retained, resident, parked)
		}
		if d := float64(uj) - f; d < -1e-9*f || d > 1+1e-9*f {
			t.Fatalf("%d B, %d B resident, %s: %d µJ, formula %.3f", retained, resident, parked, uj, f)
		}
	}
}

func TestEstimateSaturates(t *testing.T) {
	uj, _, in := Estimate(math.MaxUint64, math.MaxUint64, math.MaxInt64, DefaultCoefficients())
	if uj != math.MaxUint64 || in["saturated"] != "true" {
		t.Fatalf("%d %q", uj, in)
	}
}

func TestEstimateReplacesInvalidCoefficients(t *testing.T) {
	want, _, _ := Estimate(1e9, 1e9, time.Hour, DefaultCoefficients())
	uj, _, in := Estimate(1e9, 1e9, time.Hour, Coefficients{})
	if uj != want || in["coefficients_replaced"] != "cpu_watts,storage_watts_per_tb,dram_watts_per_gb" {
		t.Fatalf("zero coefficients: %d (want %d) %q", uj, want, in)
	}
	c := DefaultCoefficients()
	c.StorageWattsPerTB = math.NaN()
	uj, _, in = Estimate(1e9, 1e9, time.Hour, c)
	if uj != want || in["coefficients_replaced"] != "storage_watts_per_tb" {
		t.Fatalf("NaN storage: %d %q", uj, in)
	}
}

func TestParseCoefficients(t *testing.T) {
	hdd := DefaultCoefficients()
	hdd.StorageWattsPerTB = HDDWattsPerTB
	for _, tc := range []struct {
		json string
		want Coefficients
		err  bool
	}{
		{`{}`, DefaultCoefficients(), false},
		{`{"storage_watts_per_tb": 0.65}`, hdd, false},
		{`{"cpu_watts": 12.5, "storage_watts_per_tb": 1.2, "dram_watts_per_gb": 0.375}`, Coefficients{12.5, 1.2, 0.375}, false},
		{`{"storage_watts_per_tb": 0}`, Coefficients{}, true},
		{`{"cpu_watts": -4}`, Coefficients{}, true},
		{`{"cpu_watt": 4}`, Coefficients{}, true},
		{`{"cpu_watts": "4"}`, Coefficients{}, true},
		{`{} {}`, Coefficients{}, true},
		{`[]`, Coefficients{}, true},
	} {
		c, err := ParseCoefficients([]byte(tc.json))
		if tc.err {
			if !errors.Is(err, ErrCoefficients) {
				t.Errorf("%s: %v, want ErrCoefficients", tc.json, err)
			}
			continue
		}
		if err != nil || c != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.json, c, err, tc.want)
		}
	}
	if err := DefaultCoefficients().Validate(); err != nil {
		t.Fatal(err)
	}
}

// The figures are taken at their decimal value: 1.2 is 12/10 exactly, so
// a TB-hour is 4320 J on the microjoule and not a rounding of the binary
// double nearest 1.2.
func TestFigureIsDecimal(t *testing.T) {
	if r := figure(1.2); r.String() != "6/5" {
		t.Fatalf("figure(1.2) = %s", r)
	}
	if r := figure(0.392); r.String() != "49/125" {
		t.Fatalf("figure(0.392) = %s", r)
	}
}

func ExampleEstimate() {
	// A transcript park: 1 MB kept on SSD for a day.
	uj, prov, in := Estimate(1_000_000, 0, 24*time.Hour, DefaultCoefficients())
	fmt.Println(uj, prov, in["method"], in["storage_watts_per_tb"])
	// Output: 103680 estimated retained-bytes-coefficient 1.2
}
