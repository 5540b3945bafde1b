package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// runrecordd_criu_info shows the CRIU build once the daemon gave it:
// its version, whether it is known, and its patches by number.
func TestCRIUInfo(t *testing.T) {
	var m Metrics
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCRIUCollector(&m))
	if fams, err := reg.Gather(); err != nil || len(fams) != 0 {
		t.Fatalf("without a build: %d families, %v", len(fams), err)
	}
	m.CRIUFrom(CRIUInfo{Version: "4.2.1", Known: true, Patches: []string{"1-lazy-pages-wait.patch", "2-lazy-pages-keep-uffds.patch", "12-x.patch"}})
	fams, err := reg.Gather()
	if err != nil || len(fams) != 1 || fams[0].GetName() != metricCRIUInfo {
		t.Fatalf("families %v, %v", fams, err)
	}
	problems, err := promlint.NewWithMetricFamilies(fams).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	mt := fams[0].GetMetric()[0]
	got := map[string]string{}
	for _, l := range mt.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if got["version"] != "4.2.1" || got["known"] != "true" || got["patches"] != "1,2,12" || mt.GetGauge().GetValue() != 1 {
		t.Errorf("labels %v, value %v", got, mt.GetGauge().GetValue())
	}
	m.CRIUFrom(CRIUInfo{Version: "4.2.1"})
	fams, _ = reg.Gather()
	if l := fams[0].GetMetric()[0].GetLabel(); l[0].GetValue() != "false" || l[1].GetValue() != "" {
		t.Errorf("an unknown build without patches: labels %v", l)
	}
}
