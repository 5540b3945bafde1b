package metrics

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metricCRIUInfo is the CRIU build the daemon runs (docs/setup.md, "The
// CRIU build").
const metricCRIUInfo = "runrecordd_criu_info"

// CRIUInfo is what runrecordd_criu_info shows of the CRIU build.
type CRIUInfo struct {
	Version string   // `criu --version`'s
	Known   bool     // the binary is the build its manifest describes
	Patches []string // the deploy/criu patches it carries, by name
}

// CRIUFrom has each scrape show info as runrecordd_criu_info; unset (a
// daemon without a host: unit tests), the metric is left out.
func (m *Metrics) CRIUFrom(info CRIUInfo) { m.criu.Store(&info) }

type criuSource = atomic.Pointer[CRIUInfo]

type criuCollector struct {
	m    *Metrics
	info *prometheus.Desc
}

func newCRIUCollector(m *Metrics) *criuCollector {
	return &criuCollector{m: m, info: prometheus.NewDesc(metricCRIUInfo,
		"The CRIU this daemon runs, always 1: its version, whether it is the build deploy/setup.sh's manifest describes (known), and the deploy/criu patches it carries by number, comma-separated.",
		[]string{"version", "known", "patches"}, nil)}
}

func (c *criuCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.info }

func (c *criuCollector) Collect(ch chan<- prometheus.Metric) {
	info := c.m.criu.Load()
	if info == nil {
		return
	}
	known := "false"
	if info.Known {
		known = "true"
	}
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, info.Version, known, PatchNumbers(info.Patches))
}

// PatchNumbers is the deploy/criu patches named (as "2-lazy-pages-...")
// by their numbers, comma-separated, as the CRIU labels carry them.
func PatchNumbers(patches []string) string {
	nums := make([]string, 0, len(patches))
	for _, p := range patches {
		n, _, _ := strings.Cut(p, "-")
		nums = append(nums, n)
	}
	return strings.Join(nums, ",")
}
