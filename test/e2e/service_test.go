//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// TestMetricsListen: serve --metrics-listen serves /metrics alone over
// plain HTTP: the build and the runtime it drives, image parks'
// availability, the store's bytes, failures by route and code, and no
// label that names a run; every other path is 404. Its log is JSON
// (--log-format json).
func TestMetricsListen(t *testing.T) {
	privileged(t)
	addr := freeAddr(t)
	d := mustDaemon(t, "metrics", func(d *daemon) { d.flags = []string{"--metrics-listen", addr, "--log-format", "json"} })
	const ghost = "no-such-run-7f3a"
	var ae *api.Error
	if _, err := d.c.Show(context.Background(), ghost); !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
		t.Fatalf("show of a run that does not exist: %v", err)
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s, %v", resp.Status, err)
	}
	if strings.Contains(string(body), ghost) {
		t.Fatalf("the scrape names the run id %s:\n%s", ghost, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	bi := fams["runrecordd_build_info"]
	if bi == nil || len(bi.GetMetric()) != 1 {
		t.Fatalf("runrecordd_build_info: %v", bi)
	}
	for _, l := range []string{"version", "criu", "runc", "containerd"} {
		if label(bi.GetMetric()[0], l) == "" {
			t.Errorf("runrecordd_build_info has no %s: %v", l, bi.GetMetric()[0])
		}
	}
	failed := false
	for _, m := range fams["runrecordd_failures_total"].GetMetric() {
		if label(m, "op") == "GET /v1/runs/{id}" && label(m, "code") == api.CodeNotFound && m.GetCounter().GetValue() == 1 {
			failed = true
		}
	}
	if !failed {
		t.Errorf("no runrecordd_failures_total{op=\"GET /v1/runs/{id}\",code=\"not_found\"} 1: %v", fams["runrecordd_failures_total"])
	}
	for _, name := range []string{"runrecordd_image_parks_available", "runrecordd_store_free_bytes", "runrecordd_store_used_bytes", "runrecordd_runs"} {
		if fams[name] == nil {
			t.Errorf("%s not served", name)
		}
	}
	if f := fams["runrecordd_store_free_bytes"]; f != nil && f.GetMetric()[0].GetGauge().GetValue() <= 0 {
		t.Errorf("runrecordd_store_free_bytes %v", f.GetMetric()[0])
	}

	logged, err := os.ReadFile(d.log)
	if err != nil {
		t.Fatal(err)
	}
	said := false
	for _, line := range strings.Split(string(logged), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "serving metrics" && m["metrics-listen"] == addr {
			said = true
		}
	}
	if !said {
		t.Errorf("no JSON line {\"msg\":\"serving metrics\",\"metrics-listen\":%q} in the daemon's log:\n%s", addr, logged)
	}

	for _, path := range []string{"/", "/v1/host", "/v1/runs", "/metrics/x", "/debug/pprof/"} {
		resp, err := http.Get(fmt.Sprintf("http://%s%s", addr, path))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s on the metrics listener: %s, want 404", path, resp.Status)
		}
	}

	// The stop closes the listener; the next start serves it again.
	mustStop(t, d)
	if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /metrics of a stopped daemon: %s", resp.Status)
	}
	mustStart(t, d)
	resp, err = http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics after a restart: %s", resp.Status)
	}
}
