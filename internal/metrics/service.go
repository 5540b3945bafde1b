package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// The service's metrics (docs/operations.md, "Metrics"): what a
// Prometheus scraper alerts on.
const (
	metricBuildInfo  = "runrecordd_build_info"
	metricFailures   = "runrecordd_failures_total"
	metricImageParks = "runrecordd_image_parks_available"
	metricStoreFree  = "runrecordd_store_free_bytes"
	metricStoreUsed  = "runrecordd_store_used_bytes"
	labelOp          = "op"
	labelCode        = "code"
)

// The values of runrecordd_image_parks_available.
const (
	ImageParksProbing     = -1
	ImageParksUnavailable = 0
	ImageParksAvailable   = 1
)

// Build is the daemon's build and the runtime it drives, as
// runrecordd_build_info labels it. CRIUPatches is empty while the host
// does not know its CRIU's patch set.
type Build struct {
	Version, CRIU, CRIUPatches, Runc, Containerd string
}

// Service is what a scrape reads of the running service: whether image
// parks are available and where its store lies.
type Service struct {
	// ImageParks is 1 when image parks are available, 0 when they are
	// not, -1 while the probe runs.
	ImageParks func() int
	// StoreDir is the store's directory: its filesystem's free and used
	// bytes are read at each scrape.
	StoreDir string
}

// serviceMetrics are the service's: the build, failures by code, and the
// service's state read at each scrape.
type serviceMetrics struct {
	build    atomic.Pointer[Build]
	svc      atomic.Pointer[Service]
	failures *prometheus.CounterVec // op, code
}

// SetBuild sets what runrecordd_build_info labels.
func (m *Metrics) SetBuild(b Build) { m.service.build.Store(&b) }

// ServiceFrom has each scrape read s.
func (m *Metrics) ServiceFrom(s Service) { m.service.svc.Store(&s) }

// Failed counts a request of the API that failed with the error code
// code; op is its route's pattern (e.g. "POST /v1/runs/{id}/park"), never
// a path, so that no run id becomes a label.
func (m *Metrics) Failed(op, code string) {
	m.init()
	if op == "" {
		op = "unrouted"
	}
	m.service.failures.WithLabelValues(op, code).Inc()
}

func newFailures() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricFailures,
		Help: "API requests that failed, by route (op: its pattern, e.g. \"POST /v1/runs/{id}/park\") and error code (pkg/api)."},
		[]string{labelOp, labelCode})
}

// serviceCollector reads the build and the service at each scrape.
type serviceCollector struct {
	m                        *Metrics
	build, parks, free, used *prometheus.Desc
	statfs                   func(dir string, st *unix.Statfs_t) error
}

func newServiceCollector(m *Metrics) *serviceCollector {
	return &serviceCollector{m: m, statfs: unix.Statfs,
		build: prometheus.NewDesc(metricBuildInfo,
			"Always 1: the daemon's version and the CRIU (with its patch set, when the host knows it), runc and containerd it drives.",
			[]string{"version", "criu", "criu_patches", "runc", "containerd"}, nil),
		parks: prometheus.NewDesc(metricImageParks,
			"1 if image parks are available on this host (CRIU and the runtime passed the probe), 0 if not (docs/daemon.md), -1 while the probe runs.",
			nil, nil),
		free: prometheus.NewDesc(metricStoreFree,
			"Bytes the store's filesystem can still take (statfs f_bavail × f_bsize); image parks leave serve --min-free of it.",
			nil, nil),
		used: prometheus.NewDesc(metricStoreUsed,
			"Bytes in use on the store's filesystem ((f_blocks − f_bfree) × f_bsize): the store's own when it has a filesystem of its own, as docs/operations.md advises.",
			nil, nil),
	}
}

func (c *serviceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.build
	ch <- c.parks
	ch <- c.free
	ch <- c.used
}

func (c *serviceCollector) Collect(ch chan<- prometheus.Metric) {
	if b := c.m.service.build.Load(); b != nil {
		ch <- prometheus.MustNewConstMetric(c.build, prometheus.GaugeValue, 1, b.Version, b.CRIU, b.CRIUPatches, b.Runc, b.Containerd)
	}
	s := c.m.service.svc.Load()
	if s == nil {
		return
	}
	if s.ImageParks != nil {
		ch <- prometheus.MustNewConstMetric(c.parks, prometheus.GaugeValue, float64(s.ImageParks()))
	}
	if s.StoreDir == "" {
		return
	}
	var st unix.Statfs_t
	if err := c.statfs(s.StoreDir, &st); err != nil {
		ch <- prometheus.NewInvalidMetric(c.free, err)
		return
	}
	bs := uint64(st.Bsize)
	ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(st.Bavail*bs))
	ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64((st.Blocks-st.Bfree)*bs))
}
