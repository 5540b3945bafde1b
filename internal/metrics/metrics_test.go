package metrics

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/testhost"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// metricsHost is a store and a meter (internal/testhost) and the metrics
// counted over them.
type metricsHost struct {
	*testhost.Fixture
	m *Metrics
	t *testing.T
}

func mustMetricsHost(t *testing.T, raplCase string, c ...idle.Coefficients) metricsHost {
	t.Helper()
	return metricsHost{Fixture: testhost.New(t, raplCase, c...), m: &Metrics{}, t: t}
}

// source is the daemon's Source over the test host's store and meter.
type source struct{ *testhost.Fixture }

func (s source) Runs(p record.Phase) ([]string, error)        { return s.Store.Runs(p) }
func (s source) Run(id string) (store.Run, error)             { return s.Store.Run(id) }
func (s source) Retained(snap record.Snapshot) (int64, error) { return park.Retained(s.Store, snap) }
func (s source) Coefficients() idle.Coefficients              { return s.Meter.Coefficients() }
func (s source) Snapshot() idle.Snapshot                      { return s.Meter.Snapshot() }

func (h metricsHost) handler() http.Handler { return h.m.Handler(source{h.Fixture}, testhost.Log(h.t)) }

// scrape GETs srv's /metrics and parses it.
func scrape(t *testing.T, srv *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func get(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// metricOf returns the sample of family name whose labels are labels
// (name=value pairs), or nil.
func metricOf(fams map[string]*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel())*2 != len(labels) {
			continue
		}
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is a gauge's or counter's value.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	m := metricOf(fams, name, labels...)
	if m == nil {
		t.Fatalf("no %s%q in the scrape", name, labels)
	}
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	t.Fatalf("%s%q is neither a gauge nor a counter", name, labels)
	return 0
}

func wantValue(t *testing.T, fams map[string]*dto.MetricFamily, want float64, name string, labels ...string) {
	t.Helper()
	if got := value(t, fams, name, labels...); got != want {
		t.Errorf("%s%q = %v, want %v", name, labels, got, want)
	}
}

func wantPhases(t *testing.T, fams map[string]*dto.MetricFamily, executing, parked, closed float64) {
	t.Helper()
	wantValue(t, fams, executing, metricRuns, "phase", "executing")
	wantValue(t, fams, parked, metricRuns, "phase", "parked")
	wantValue(t, fams, closed, metricRuns, "phase", "closed")
}

// wantRetained checks the retained bytes and the idle draw they cost at
// the default SSD coefficient, 1.2 W per 10¹² bytes.
func wantRetained(t *testing.T, fams map[string]*dto.MetricFamily, retained int64) {
	t.Helper()
	wantValue(t, fams, float64(retained), metricRetained)
	got := value(t, fams, metricIdleDraw, "provenance", "estimated")
	want := float64(retained) * 1.2 / 1e12
	if math.Abs(got-want) > want*1e-15 {
		t.Errorf("%s = %v, want %v (%d bytes × 1.2 W/TB)", metricIdleDraw, got, want, retained)
	}
}

// TestMetricsRunsAndIdleDraw parks runs of both kinds in a real store and
// checks, scrape by scrape, the runs by phase, the bytes the parks retain
// and the idle draw that costs, as parks begin and end.
func TestMetricsRunsAndIdleDraw(t *testing.T) {
	h := mustMetricsHost(t, "")
	if c := h.Meter.Coefficients(); c.StorageWattsPerTB != idle.SSDWattsPerTB || idle.SSDWattsPerTB != 1.2 {
		t.Fatalf("storage coefficient %v, the test expects the 1.2 W/TB default", c.StorageWattsPerTB)
	}
	srv := httptest.NewServer(h.handler())
	defer srv.Close()

	fams := scrape(t, srv)
	wantPhases(t, fams, 0, 0, 0)
	wantValue(t, fams, 0, metricRetained)
	wantValue(t, fams, 0, metricIdleDraw, "provenance", "estimated")
	wantValue(t, fams, 0, metricRAPL) // the tree has no powercap class
	wantValue(t, fams, 0, metricReceipts, "provenance", "measured")
	wantValue(t, fams, 0, metricReceipts, "provenance", "estimated")

	h.Start(t, "exec-1")
	h.Start(t, "closed-1")
	h.Append(t, "closed-1", record.Closure("done"))
	h.Start(t, "tpark")
	tsnap := h.TranscriptPark(t, 64<<10)
	h.Park(t, "tpark", tsnap)

	fams = scrape(t, srv)
	wantPhases(t, fams, 1, 1, 1)
	wantValue(t, fams, 65536, metricRetained)
	// 65536 B × 1.2 W / 10¹² B, exactly: the nearest double to 7.86432e-8.
	wantValue(t, fams, 7.86432e-08, metricIdleDraw, "provenance", "estimated")

	// An image park: a root holding rootfs.tar and a CRIU image directory.
	h.Start(t, "ipark")
	rootAddr, rootBytes := h.DirObject(t, map[string]int{"rootfs.tar": 10240})
	memAddr, memBytes := h.DirObject(t, map[string]int{"pages-1.img": 1 << 20, "core-1.img": 1234, "mm-1.img": 987})
	isnap := record.ImageSnapshot(rootAddr, &memAddr)
	h.Park(t, "ipark", isnap)
	image := rootBytes + memBytes
	if image <= 10240+(1<<20)+1234+987 {
		t.Fatalf("image park retains %d bytes: its listings count too", image)
	}

	fams = scrape(t, srv)
	wantPhases(t, fams, 1, 2, 1)
	wantRetained(t, fams, 65536+image)

	// The transcript park resumes: it retains nothing any more.
	h.Append(t, "tpark", record.Resumption(tsnap, 5, record.Estimated))
	fams = scrape(t, srv)
	wantPhases(t, fams, 2, 1, 1)
	wantRetained(t, fams, image)

	// The image park is abandoned, closed while parked.
	h.Append(t, "ipark", record.Closure("abandoned"))
	fams = scrape(t, srv)
	wantPhases(t, fams, 2, 0, 2)
	wantValue(t, fams, 0, metricRetained)
	wantValue(t, fams, 0, metricIdleDraw, "provenance", "estimated")
	wantValue(t, fams, 0, "promhttp_metric_handler_errors_total", "cause", "gathering")
}

// TestMetricsIdleDrawCoefficients checks the draw against configured
// coefficients, the HDD figure of 0.65 W/TB, and two parks of one object.
func TestMetricsIdleDrawCoefficients(t *testing.T) {
	h := mustMetricsHost(t, "", idle.Coefficients{CPUWatts: idle.DefaultCPUWatts,
		StorageWattsPerTB: idle.HDDWattsPerTB, DRAMWattsPerGB: idle.DefaultDRAMWattsPerGB})
	h.Start(t, "p")
	h.Park(t, "p", h.TranscriptPark(t, 1000))
	srv := httptest.NewServer(h.handler())
	defer srv.Close()
	// 1000 B × 0.65 W / 10¹² B.
	wantValue(t, scrape(t, srv), 6.5e-10, metricIdleDraw, "provenance", "estimated")

	// A second run parks the same transcript: the store keeps it once, but
	// each park is charged for it, and so it counts twice.
	h.Start(t, "q")
	h.Park(t, "q", h.TranscriptPark(t, 1000))
	fams := scrape(t, srv)
	wantValue(t, fams, 2000, metricRetained)
	wantValue(t, fams, 1.3e-09, metricIdleDraw, "provenance", "estimated")
}

func TestDrawWatts(t *testing.T) {
	for _, c := range []struct {
		retained, resident uint64
		storage, dram      float64
		want               float64
	}{
		{0, 0, 1.2, 0.392, 0},
		{1e12, 0, 1.2, 0.392, 1.2},
		{1e12, 0, 0.65, 0.392, 0.65},
		{65536, 0, 1.2, 0.392, 7.86432e-08},
		{1000, 0, 1.2, 0.392, 1.2e-09},
		{0, 1e9, 1.2, 0.392, 0.392},
		{1e12, 1e9, 1.2, 0.392, 1.592},
		{math.MaxUint64, 0, 1.2, 0.392, 2.213609288845146e+07}, // (2⁶⁴−1) × 1.2 / 10¹² = 22136092.888451461938…, rounded once
	} {
		if got := drawWatts(c.retained, c.resident, c.storage, c.dram); got != c.want {
			t.Errorf("drawWatts(%d, %d, %v, %v) = %v, want %v", c.retained, c.resident, c.storage, c.dram, got, c.want)
		}
	}
}

// TestMetricsUnreadablePark removes a parked run's transcript from the
// store: the retained bytes and the draw cannot be known, so they are left
// out (and the error counted and logged); everything else is served.
func TestMetricsUnreadablePark(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.Start(t, "p")
	snap := h.TranscriptPark(t, 100)
	h.Park(t, "p", snap)
	if err := os.Remove(h.Store.Path(*snap.Transcript)); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h.handler())
	defer srv.Close()
	for i := range 2 {
		fams := scrape(t, srv)
		wantPhases(t, fams, 0, 1, 0)
		wantValue(t, fams, 0, metricRAPL)
		if fams[metricRetained] != nil || fams[metricIdleDraw] != nil {
			t.Errorf("retained bytes or idle draw served over a missing object: %v %v", fams[metricRetained], fams[metricIdleDraw])
		}
		// A scrape counts its own error after it is gathered.
		wantValue(t, fams, float64(i), "promhttp_metric_handler_errors_total", "cause", "gathering")
	}
}

// TestMetricsEnergy meters two real intervals on a host tree with a RAPL
// package zone — one measured, one estimated because the zone cannot be
// read at its end — and feeds their receipts, parks and resumes through the
// daemon's hooks.
func TestMetricsEnergy(t *testing.T) {
	h := mustMetricsHost(t, "package-only")
	const (
		unitA   = "/runrecordd/unit-a"
		cpuStat = "cgroup-v2/runrecordd/unit-a/cpu.stat"
		energy  = "sys/class/powercap/intel-rapl:0/energy_uj"
		core    = "sys/class/powercap/intel-rapl:0:0/energy_uj"
	)
	// Hooks before the handler exists: the zero metrics must take them.
	h.m.Parked(1500 * time.Millisecond)

	srv := httptest.NewServer(h.handler())
	defer srv.Close()
	fams := scrape(t, srv)
	wantValue(t, fams, 1, metricRAPL)
	for _, k := range []string{"active", "idle"} {
		for _, p := range []string{"measured", "estimated"} {
			wantValue(t, fams, 0, metricEnergy, "kind", k, "provenance", p)
		}
	}

	// Measured: the package zone (not its core subzone) moves 1 J while
	// the sandbox uses 2 s of the host's 4 s of busy CPU time: 0.5 J.
	iv, err := h.Meter.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	h.Rewrite(t, energy, "6000000")
	h.Rewrite(t, core, "2700000")
	h.Rewrite(t, cpuStat, "usage_usec 3000000\nuser_usec 3000000\nsystem_usec 0\n")
	h.Rewrite(t, "proc/stat", "cpu  32382 0 8090 974995 591 0 91 29 0 0\ncpu0 16976 0 3834 487409 90 0 18 13 0 0\nbtime 1764000000\n")
	rc, err := iv.End()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Provenance != record.Measured || rc.UJ != 500000 {
		t.Fatalf("first receipt: %d µJ %s (%v), want 500000 measured", rc.UJ, rc.Provenance, rc.Inputs)
	}
	h.m.Receipt(rc)

	// Estimated: the counter does not parse at the interval's end; 1 s of
	// CPU × 4.24 W.
	iv, err = h.Meter.Begin(unitA)
	if err != nil {
		t.Fatal(err)
	}
	h.Rewrite(t, energy, "garbage")
	h.Rewrite(t, cpuStat, "usage_usec 4000000\nuser_usec 4000000\nsystem_usec 0\n")
	rc2, err := iv.End()
	if err != nil {
		t.Fatal(err)
	}
	if rc2.Provenance != record.Estimated || rc2.UJ != 4240000 {
		t.Fatalf("second receipt: %d µJ %s (%v), want 4240000 estimated", rc2.UJ, rc2.Provenance, rc2.Inputs)
	}
	h.m.Receipt(rc2)

	fams = scrape(t, srv)
	wantValue(t, fams, 0, metricRAPL) // the zone did not read at the last sample
	wantValue(t, fams, 1, metricReceipts, "provenance", "measured")
	wantValue(t, fams, 1, metricReceipts, "provenance", "estimated")
	wantValue(t, fams, 0.5, metricEnergy, "kind", "active", "provenance", "measured")
	wantValue(t, fams, 4.24, metricEnergy, "kind", "active", "provenance", "estimated")

	// The zone reads again.
	h.Rewrite(t, energy, "7000000")
	h.Meter.Sample()

	h.m.Parked(62500 * time.Microsecond)
	h.m.Resumed(200*time.Millisecond, 47564, record.Estimated)
	h.m.Resumed(45*time.Second, 392000, record.Measured)

	fams = scrape(t, srv)
	wantValue(t, fams, 1, metricRAPL)
	wantValue(t, fams, 0.047564, metricEnergy, "kind", "idle", "provenance", "estimated")
	wantValue(t, fams, 0.392, metricEnergy, "kind", "idle", "provenance", "measured")
	wantValue(t, fams, 0.5, metricEnergy, "kind", "active", "provenance", "measured")

	wantHistogram(t, fams, metricParkTime, 1.5625, map[float64]uint64{
		0.05: 0, 0.1: 1, 0.25: 1, 0.5: 1, 1: 1, 2.5: 2, 5: 2, 10: 2, 20: 2, 30: 2, math.Inf(1): 2})
	wantHistogram(t, fams, metricResumeTime, 45.2, map[float64]uint64{
		0.05: 0, 0.1: 0, 0.25: 1, 0.5: 1, 1: 1, 2.5: 1, 5: 1, 10: 1, 20: 1, 30: 1, math.Inf(1): 2})
}

// wantHistogram checks a histogram's sum and cumulative bucket counts.
func wantHistogram(t *testing.T, fams map[string]*dto.MetricFamily, name string, sum float64, buckets map[float64]uint64) {
	t.Helper()
	m := metricOf(fams, name)
	if m == nil || m.Histogram == nil {
		t.Fatalf("no histogram %s", name)
	}
	hg := m.Histogram
	if math.Abs(hg.GetSampleSum()-sum) > 1e-9 {
		t.Errorf("%s sum = %v, want %v", name, hg.GetSampleSum(), sum)
	}
	if want := buckets[math.Inf(1)]; hg.GetSampleCount() != want {
		t.Errorf("%s count = %d, want %d", name, hg.GetSampleCount(), want)
	}
	got := map[float64]uint64{}
	for _, b := range hg.GetBucket() {
		got[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	if _, ok := got[math.Inf(1)]; !ok { // the text format's +Inf bucket may be folded into the count
		got[math.Inf(1)] = hg.GetSampleCount()
	}
	if fmt.Sprint(got) != fmt.Sprint(buckets) {
		t.Errorf("%s buckets = %v, want %v", name, got, buckets)
	}
}

// TestMetricsLint runs promlint over a scrape of the daemon's own metrics.
func TestMetricsLint(t *testing.T) {
	h := mustMetricsHost(t, "package-only")
	h.Start(t, "p")
	h.Park(t, "p", h.TranscriptPark(t, 10))
	h.m.Parked(time.Second)
	h.m.Resumed(time.Second, 1, record.Estimated)
	h.m.Migrated(true, true, time.Second)
	h.m.Migrated(false, false, 0)
	h.m.Drained(true)
	h.m.OwnershipRefused()
	fams, err := h.m.Registry(source{h.Fixture}).Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ours []*dto.MetricFamily
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "runrecordd_") {
			ours = append(ours, f)
		}
	}
	if len(ours) != 12 {
		t.Errorf("%d runrecordd_ metric families, want 12", len(ours))
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestMetricsConcurrent scrapes while hooks fire and runs park and resume
// (for the race detector), then checks the counts add up.
func TestMetricsConcurrent(t *testing.T) {
	h := mustMetricsHost(t, "")
	srv := httptest.NewServer(h.handler())
	defer srv.Close()
	const n = 50
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range n {
				if _, err := get(srv.URL); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range n {
			h.m.Parked(time.Millisecond)
			h.m.Resumed(time.Millisecond, uint64(i), record.Estimated)
		}
	})
	for i := range 10 { // runs park and resume meanwhile
		id := fmt.Sprintf("r%d", i)
		h.Start(t, id)
		snap := h.TranscriptPark(t, 1000+i)
		h.Park(t, id, snap)
		h.Append(t, id, record.Resumption(snap, 1, record.Estimated))
	}
	wg.Wait()
	fams := scrape(t, srv)
	wantPhases(t, fams, 10, 0, 0)
	wantValue(t, fams, 0.001225, metricEnergy, "kind", "idle", "provenance", "estimated")
	if c := metricOf(fams, metricParkTime).GetHistogram().GetSampleCount(); c != n {
		t.Errorf("%d parks counted, want %d", c, n)
	}
}

// The fleet's hooks count by direction and outcome; only a successful
// migration out is timed.
func TestFleetMetrics(t *testing.T) {
	var m Metrics
	m.Migrated(true, true, 2*time.Second)
	m.Migrated(true, false, time.Second)
	m.Migrated(false, true, time.Second)
	m.Drained(false)
	m.OwnershipRefused()
	m.OwnershipRefused()
	for _, c := range []struct {
		got  float64
		want float64
		what string
	}{
		{testutil.ToFloat64(m.fleet.migrations.WithLabelValues("out", "ok")), 1, "out ok"},
		{testutil.ToFloat64(m.fleet.migrations.WithLabelValues("out", "failed")), 1, "out failed"},
		{testutil.ToFloat64(m.fleet.migrations.WithLabelValues("in", "ok")), 1, "in ok"},
		{testutil.ToFloat64(m.fleet.drained.WithLabelValues("left")), 1, "drain left"},
		{testutil.ToFloat64(m.fleet.refusals), 2, "refusals"},
		{float64(testutil.CollectAndCount(m.fleet.took)), 1, "migration histogram"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
}
