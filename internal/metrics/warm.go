package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runrecordd/runrecordd/internal/warmpool"
)

// The warm pool's metrics (docs/operations.md, "Metrics").
const (
	metricWarmSandboxes = "runrecordd_warm_pool_sandboxes"
	metricWarmMax       = "runrecordd_warm_pool_max"
	metricWarmTotal     = "runrecordd_warm_pool_total"
	metricWarmResumes   = "runrecordd_warm_resumes_total"
)

// warmSource is the pool's statistics, read at each scrape; unset (a
// daemon without a host: unit tests), the pool's metrics are left out.
type warmSource = atomic.Pointer[func() warmpool.Stats]

// WarmFrom has each scrape read the warm pool's size and counts from
// stats (warmpool.Pool.Stats).
func (m *Metrics) WarmFrom(stats func() warmpool.Stats) { m.warm.Store(&stats) }

// WarmResumed counts a resume that took a warm sandbox (warm) or made one.
func (m *Metrics) WarmResumed(warm bool) {
	if warm {
		m.warmResumes[1].Add(1)
	} else {
		m.warmResumes[0].Add(1)
	}
}

// warmCollector reads the pool at each scrape.
type warmCollector struct {
	m                            *Metrics
	sandboxes, max, total, wakes *prometheus.Desc
}

func newWarmCollector(m *Metrics) *warmCollector {
	return &warmCollector{m: m,
		sandboxes: prometheus.NewDesc(metricWarmSandboxes,
			"Warm sandboxes this host holds for parked transcript runs, by state (ready: waiting for the run's resume; preparing: being made or discarded).",
			[]string{"state"}, nil),
		max: prometheus.NewDesc(metricWarmMax, "The most warm sandboxes this host keeps at once (serve --warm-pool; 0: none).", nil, nil),
		total: prometheus.NewDesc(metricWarmTotal,
			"Warm sandboxes by what became of them: made, used by a resume, missed (a resume found none), refused (the pool was full), failed (not made), expired, dropped (the run closed or left).",
			[]string{"outcome"}, nil),
		wakes: prometheus.NewDesc(metricWarmResumes,
			"Transcript resumes by sandbox: warm (a warm sandbox's task started) or made (created and started at the resume).",
			[]string{"sandbox"}, nil),
	}
}

func (c *warmCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sandboxes
	ch <- c.max
	ch <- c.total
	ch <- c.wakes
}

func (c *warmCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.warm.Load()
	if f == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.wakes, prometheus.CounterValue, float64(c.m.warmResumes[1].Load()), "warm")
	ch <- prometheus.MustNewConstMetric(c.wakes, prometheus.CounterValue, float64(c.m.warmResumes[0].Load()), "made")
	st := (*f)()
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(st.Max))
	ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(st.Ready), "ready")
	ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(st.Preparing), "preparing")
	for outcome, n := range map[string]uint64{"made": st.Made, "used": st.Used, "missed": st.Missed, "refused": st.Refused,
		"failed": st.Failed, "expired": st.Expired, "dropped": st.Dropped} {
		ch <- prometheus.MustNewConstMetric(c.total, prometheus.CounterValue, float64(n), outcome)
	}
}
