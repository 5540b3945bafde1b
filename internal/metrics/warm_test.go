package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/runrecordd/runrecordd/internal/warmpool"
)

// The warm pool's size and counts show in a scrape once the daemon has
// given its pool; before, they are left out.
func TestWarmMetrics(t *testing.T) {
	var m Metrics
	gather := func() map[string]*dto.MetricFamily {
		t.Helper()
		fams, err := newRegistryOf(newWarmCollector(&m)).Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			if strings.HasPrefix(f.GetName(), "runrecordd_") {
				out[f.GetName()] = f
			}
		}
		return out
	}
	if fams := gather(); len(fams) != 0 {
		t.Fatalf("without a pool: %d families", len(fams))
	}
	m.WarmFrom(func() warmpool.Stats {
		return warmpool.Stats{Max: 8, Ready: 2, Preparing: 1, Made: 5, Used: 3, Expired: 1}
	})
	m.WarmResumed(true)
	m.WarmResumed(true)
	m.WarmResumed(false)
	fams := gather()
	var list []*dto.MetricFamily
	for _, f := range fams {
		list = append(list, f)
	}
	if len(list) != 4 {
		t.Fatalf("%d warm families, want 4", len(list))
	}
	problems, err := promlint.NewWithMetricFamilies(list).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	want := map[string]float64{"max": 8, "ready": 2, "preparing": 1, "used": 3, "expired": 1, "warm": 2, "made-resumes": 1}
	got := map[string]float64{"max": fams[metricWarmMax].GetMetric()[0].GetGauge().GetValue()}
	for _, mt := range fams[metricWarmSandboxes].GetMetric() {
		got[mt.GetLabel()[0].GetValue()] = mt.GetGauge().GetValue()
	}
	for _, mt := range fams[metricWarmTotal].GetMetric() {
		if v := mt.GetLabel()[0].GetValue(); v == "used" || v == "expired" {
			got[v] = mt.GetCounter().GetValue()
		}
	}
	for _, mt := range fams[metricWarmResumes].GetMetric() {
		k := mt.GetLabel()[0].GetValue()
		if k == "made" {
			k = "made-resumes"
		}
		got[k] = mt.GetCounter().GetValue()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func newRegistryOf(c *warmCollector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	return reg
}
