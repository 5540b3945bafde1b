package metrics

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metricCRIUInfo is the CRIU build the daemon runs (docs/setup.md, "The
// CRIU build").
const metricCRIUInfo = "runrecordd_criu_info"

// metricCRIUOff is a fast path the daemon turned off for want of a
// deploy/criu patch.
const metricCRIUOff = "runrecordd_criu_fast_path_off"

// CRIUInfo is what runrecordd_criu_info shows of the CRIU build.
type CRIUInfo struct {
	Version string   // `criu --version`'s
	Known   bool     // the binary is the build its manifest describes
	Patches []string // the deploy/criu patches it carries, by name
	// Off are the fast paths turned off for want of a patch, each as
	// "FLAG: why" (host.Host's CRIUOff).
	Off []string
}

// CRIUFrom has each scrape show info as runrecordd_criu_info; unset (a
// daemon without a host: unit tests), the metric is left out.
func (m *Metrics) CRIUFrom(info CRIUInfo) { m.criu.Store(&info) }

type criuSource = atomic.Pointer[CRIUInfo]

type criuCollector struct {
	m    *Metrics
	info *prometheus.Desc
	off  *prometheus.Desc
}

func newCRIUCollector(m *Metrics) *criuCollector {
	return &criuCollector{m: m, info: prometheus.NewDesc(metricCRIUInfo,
		"The CRIU this daemon runs, always 1: its version, whether it is the build deploy/setup.sh's manifest describes (known), and the deploy/criu patches it carries by number, comma-separated.",
		[]string{"version", "known", "patches"}, nil),
		off: prometheus.NewDesc(metricCRIUOff,
			"A fast path this daemon turned off because its CRIU lacks the deploy/criu patch it needs, always 1, by its serve flag (the log and `runrecordd host` say which patch).",
			[]string{"flag"}, nil)}
}

func (c *criuCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.info
	ch <- c.off
}

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
	for _, o := range info.Off {
		flag, _, _ := strings.Cut(o, ":")
		ch <- prometheus.MustNewConstMetric(c.off, prometheus.GaugeValue, 1, flag)
	}
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
