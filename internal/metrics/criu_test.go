package metrics

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// runrecordd_criu_info shows the CRIU build once the daemon gave it:
// its version, whether it is known, and its patches by number;
// runrecordd_criu_fast_path_off each fast path turned off, by its flag.
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
	m.CRIUFrom(CRIUInfo{Version: "4.2.1", Off: []string{"--lazy-resume: lacks deploy/criu/5-x.patch", "--lazy-served: lacks deploy/criu/2-x.patch"}})
	fams, _ = reg.Gather()
	// Gathered in the order of their names.
	if len(fams) != 2 || fams[0].GetName() != metricCRIUOff || fams[1].GetName() != metricCRIUInfo {
		t.Fatalf("families %v", fams)
	}
	if l := fams[1].GetMetric()[0].GetLabel(); l[0].GetValue() != "false" || l[1].GetValue() != "" {
		t.Errorf("an unknown build without patches: labels %v", l)
	}
	var flags []string
	for _, mt := range fams[0].GetMetric() {
		if l := mt.GetLabel(); len(l) == 1 && l[0].GetName() == "flag" && mt.GetGauge().GetValue() == 1 {
			flags = append(flags, l[0].GetValue())
		}
	}
	if !slices.Equal(flags, []string{"--lazy-resume", "--lazy-served"}) {
		t.Errorf("fast paths off %q", flags)
	}
	if problems, err := promlint.NewWithMetricFamilies(fams).Lint(); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
