package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/testhost"
)

// TestScrapeListener scrapes the handler serve --metrics-listen serves:
// the service's metrics with their labels, no label that names a run,
// and nothing but GET /metrics.
func TestScrapeListener(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.m.SetBuild(Build{Version: "v1.2.3", CRIU: "4.2.1", Runc: "1.5.3", Containerd: "2.3.7"})
	parks := ImageParksProbing
	h.m.ServiceFrom(Service{ImageParks: func() int { return parks }, StoreDir: t.TempDir()})
	h.m.Failed("POST /v1/runs/{id}/park", "phase")
	h.m.Failed("POST /v1/runs/{id}/park", "phase")
	h.m.Failed("", "bad_request")
	h.m.Parked(1)
	srv := httptest.NewServer(Listener(h.m.ScrapeHandler(source{h.Fixture}, testhost.Log(t))))
	defer srv.Close()

	scrapeMetrics := func() map[string]*dto.MetricFamily {
		t.Helper()
		fams, err := get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
	fams := scrapeMetrics()
	if m := metricOf(fams, metricBuildInfo, "version", "v1.2.3", "criu", "4.2.1", "criu_patches", "", "runc", "1.5.3", "containerd", "2.3.7"); m == nil || m.GetGauge().GetValue() != 1 {
		t.Fatalf("%s: %v", metricBuildInfo, fams[metricBuildInfo])
	}
	if m := metricOf(fams, metricFailures, "op", "POST /v1/runs/{id}/park", "code", "phase"); m == nil || m.GetCounter().GetValue() != 2 {
		t.Fatalf("%s: %v", metricFailures, fams[metricFailures])
	}
	if m := metricOf(fams, metricFailures, "op", "unrouted", "code", "bad_request"); m == nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("%s without a route: %v", metricFailures, fams[metricFailures])
	}
	if g := metricOf(fams, metricImageParks); g == nil || g.GetGauge().GetValue() != -1 {
		t.Fatalf("%s while probing: %v", metricImageParks, fams[metricImageParks])
	}
	parks = ImageParksAvailable
	if g := metricOf(scrapeMetrics(), metricImageParks); g == nil || g.GetGauge().GetValue() != 1 {
		t.Fatalf("%s once available: %v", metricImageParks, g)
	}
	free, used := metricOf(fams, metricStoreFree), metricOf(fams, metricStoreUsed)
	if free == nil || used == nil || free.GetGauge().GetValue() <= 0 || used.GetGauge().GetValue() <= 0 {
		t.Fatalf("store bytes: free %v, used %v", free, used)
	}
	for _, want := range []string{metricParkTime, metricRuns, metricEnergy, "go_goroutines", "process_cpu_seconds_total"} {
		if fams[want] == nil {
			t.Errorf("%s not served", want)
		}
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if slices.Contains(runLabels, l.GetName()) {
					t.Errorf("%s has label %s", name, l.GetName())
				}
			}
		}
	}

	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/", http.StatusNotFound},
		{"GET", "/v1/runs", http.StatusNotFound},
		{"GET", "/metrics/", http.StatusNotFound},
		{"GET", "/debug/pprof/", http.StatusNotFound},
		{"POST", "/metrics", http.StatusMethodNotAllowed},
		{"HEAD", "/metrics", http.StatusOK},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
	}
}

// TestScrapeDropsRunLabels: a family with a run's label is not served.
func TestScrapeDropsRunLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	byRun := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x_by_run", Help: "h"}, []string{"run"})
	byRun.WithLabelValues("r1").Set(1)
	ok := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x_total", Help: "h"})
	reg.MustRegister(byRun, ok)
	mfs, err := withoutRunLabels(reg, testhost.Log(t)).Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	if strings.Join(names, ",") != "x_total" {
		t.Fatalf("served %v, want only x_total", names)
	}
}

// TestStoreBytesUnreadable: a store whose filesystem cannot be read fails
// the two store gauges, not the scrape.
func TestStoreBytesUnreadable(t *testing.T) {
	m := &Metrics{}
	m.ServiceFrom(Service{StoreDir: "/nonexistent"})
	c := newServiceCollector(m)
	c.statfs = func(string, *unix.Statfs_t) error { return errors.New("statfs: no such file") }
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("gather: %v, want the statfs error", err)
	}
}
