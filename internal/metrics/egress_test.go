package metrics

import (
	"net/http/httptest"
	"testing"

	"github.com/runrecordd/runrecordd/internal/testhost"
)

// runrecordd_egress_bytes_total sums the intervals' traffic by
// direction, with no other label.
func TestEgressBytes(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.m.Traffic(1000, 20)
	h.m.Traffic(500, 0)
	srv := httptest.NewServer(Listener(h.m.ScrapeHandler(source{h.Fixture}, testhost.Log(t))))
	defer srv.Close()
	fams, err := get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]float64{"in": 1500, "out": 20} {
		if m := metricOf(fams, metricEgressBytes, "direction", dir); m == nil || m.GetCounter().GetValue() != want || len(m.GetLabel()) != 1 {
			t.Fatalf("%s{direction=%q}: %v, want %v", metricEgressBytes, dir, m, want)
		}
	}
}
