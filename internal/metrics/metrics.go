// Package metrics is the daemon's /metrics room: the energy it recorded,
// park and resume times (counted as they happen), and, read at each
// scrape from the store and the meter, runs by phase, the bytes parked
// runs retain and their idle draw, RAPL's state and receipt counts
// (docs/operations.md, "Metrics").
package metrics

import (
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The metric names, all prefixed runrecordd_ (docs/operations.md, "Metrics").
const (
	metricEnergy      = "runrecordd_energy_joules_total"
	metricParkTime    = "runrecordd_park_duration_seconds"
	metricResumeTime  = "runrecordd_resume_duration_seconds"
	metricIdleDraw    = "runrecordd_idle_draw_watts"
	metricRetained    = "runrecordd_parked_retained_bytes"
	metricRuns        = "runrecordd_runs"
	metricRAPL        = "runrecordd_rapl_available"
	metricReceipts    = "runrecordd_receipts_total"
	kindActive        = "active"
	kindIdle          = "idle"
	labelKind         = "kind"
	labelProvenance   = "provenance"
	labelPhase        = "phase"
	provenanceUnknown = "unknown"
)

// durationBuckets suit parks and resumes, which take from tens of
// milliseconds (a transcript) to tens of seconds (a large image): seconds.
func durationBuckets() []float64 {
	return []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30}
}

// metrics are what the daemon counts as it works, since it started: energy
// by kind and provenance, park and resume durations. The daemon calls the
// hooks; the zero value is ready (the histograms are made on first use),
// so the hooks work from the daemon's first moment. Energy is kept in
// whole microjoules, as the record keeps it, and turned into joules once,
// at scrape. What /metrics reads from the store and the meter at scrape
// time is [collector]'s.
// Metrics is what the daemon counts as it goes. The zero value is ready.
type Metrics struct {
	energyUJ [2][3]atomic.Uint64 // by kind (active, idle) and provenance (provenanceIndex)

	// warm is the warm pool's statistics (WarmFrom); warmResumes counts
	// transcript resumes, made [0] and warm [1].
	warm        warmSource
	warmResumes [2]atomic.Uint64
	// criu is the CRIU build (CRIUFrom).
	criu criuSource

	once   sync.Once
	parks  prometheus.Histogram
	resums prometheus.Histogram
	fleet  fleetMetrics

	service serviceMetrics
	// egressBytes is runrecordd_egress_bytes_total, by direction.
	egressBytes *prometheus.CounterVec
}

// Indexes of metrics.energyUJ: the kind of energy, then its provenance.
// Receipts and Resumed segments carry only the two provenances; anything
// else is counted apart, as unknown, so that it shows.
const (
	activeEnergy = 0
	idleEnergy   = 1

	measuredEnergy  = 0
	estimatedEnergy = 1
	unknownEnergy   = 2
)

func provenanceIndex(p record.Provenance) int {
	switch p {
	case record.Measured:
		return measuredEnergy
	case record.Estimated:
		return estimatedEnergy
	}
	return unknownEnergy
}

// energyLabels are the label values of metrics.energyUJ[kind][prov].
func energyLabels(kind, prov int) (string, string) {
	k := kindActive
	if kind == idleEnergy {
		k = kindIdle
	}
	p := provenanceUnknown
	switch prov {
	case measuredEnergy:
		p = record.Measured.String()
	case estimatedEnergy:
		p = record.Estimated.String()
	}
	return k, p
}

func (m *Metrics) init() {
	m.once.Do(func() {
		m.parks = prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    metricParkTime,
			Help:    "Time a successful park took, from request to the sandbox gone, in seconds.",
			Buckets: durationBuckets(),
		})
		m.resums = prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    metricResumeTime,
			Help:    "Time a successful resume took, preconditions and restore included, in seconds.",
			Buckets: durationBuckets(),
		})
		m.fleet = newFleetMetrics()
		m.service.failures = newFailures()
		m.egressBytes = newEgressBytes()
	})
}

// histograms returns the park and resume histograms, for a registry.
func (m *Metrics) histograms() []prometheus.Collector {
	m.init()
	return append([]prometheus.Collector{m.parks, m.resums, m.service.failures, m.egressBytes}, m.fleet.collectors()...)
}

// Receipt counts an executed interval's receipt (once it is recorded).
func (m *Metrics) Receipt(rc attest.Receipt) {
	m.energyUJ[activeEnergy][provenanceIndex(rc.Provenance)].Add(rc.UJ)
}

// Parked counts a successful park that took d.
func (m *Metrics) Parked(d time.Duration) {
	m.init()
	m.parks.Observe(d.Seconds())
}

// Resumed counts a successful resume that took d and recorded uj of idle
// energy with provenance p.
func (m *Metrics) Resumed(d time.Duration, uj uint64, p record.Provenance) {
	m.init()
	m.resums.Observe(d.Seconds())
	m.energyUJ[idleEnergy][provenanceIndex(p)].Add(uj)
}

// Source is what a scrape reads: the store's runs, the bytes a snapshot
// retains, and the meter.
type Source interface {
	Runs(phase record.Phase) ([]string, error)
	Run(id string) (store.Run, error)
	// Retained is the bytes snapshot holds in the store.
	Retained(snap record.Snapshot) (int64, error)
	Coefficients() idle.Coefficients
	Snapshot() idle.Snapshot
}

// Handler is the /metrics handler: m's metrics and what src says at each
// scrape, with the Go runtime's and the process's, from a registry of its
// own. A figure that cannot be read at scrape time (a parked run whose
// objects are missing, say) is left out and logged; the rest is served.
func (m *Metrics) Handler(src Source, log *slog.Logger) http.Handler {
	reg := m.Registry(src)
	if log == nil {
		log = slog.Default()
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg, // promhttp_metric_handler_errors_total
	})
}

// Registry returns a new registry holding m's metrics over src.
func (m *Metrics) Registry(src Source) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.histograms()...)
	reg.MustRegister(newCollector(m, src), newWarmCollector(m), newCRIUCollector(m), newServiceCollector(m),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// collector reads, at each scrape, what the store and the meter know now:
// runs by phase, the bytes parked runs retain and the idle draw they cost,
// and the meter's RAPL state and receipt counts; and the energy the hooks
// counted.
type collector struct {
	m   *Metrics
	src Source

	energy, runs, retained, draw, rapl, receipts *prometheus.Desc

	mu sync.Mutex
	// sizes holds, by snapshot, the bytes it retains: a snapshot names
	// content-addressed objects, so its size never changes, and a scrape
	// reads the store's listings only for parks it has not seen.
	sizes map[string]int64
}

func newCollector(m *Metrics, src Source) *collector {
	return &collector{
		m: m, src: src,
		energy: prometheus.NewDesc(metricEnergy,
			"Energy this daemon recorded since it started, in joules: kind=active sums executed intervals' receipts, "+
				"kind=idle the idle energy of resumes; by provenance. Kept in whole microjoules, as records are.",
			[]string{labelKind, labelProvenance}, nil),
		runs: prometheus.NewDesc(metricRuns,
			"Runs in the store by phase: executing, parked, closed.",
			[]string{labelPhase}, nil),
		retained: prometheus.NewDesc(metricRetained,
			"Bytes the parked runs' snapshots hold in the store.",
			nil, nil),
		draw: prometheus.NewDesc(metricIdleDraw,
			"Power drawn now by what this host's parked runs retain, in watts: "+
				"retained bytes × storage_watts_per_tb / 1e12 (+ resident bytes × dram_watts_per_gb / 1e9; no park leaves memory resident).",
			[]string{labelProvenance}, nil),
		rapl: prometheus.NewDesc(metricRAPL,
			"1 if the host has RAPL package zones and every zone read at the meter's last sample, else 0 (receipts are then estimated).",
			nil, nil),
		receipts: prometheus.NewDesc(metricReceipts,
			"Energy receipts the meter produced since the daemon started, by provenance.",
			[]string{labelProvenance}, nil),
		sizes: map[string]int64{},
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.energy, c.runs, c.retained, c.draw, c.rapl, c.receipts} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for k := range c.m.energyUJ {
		for p := range c.m.energyUJ[k] {
			uj := c.m.energyUJ[k][p].Load()
			if p == unknownEnergy && uj == 0 {
				continue // only once it happened
			}
			kind, prov := energyLabels(k, p)
			ch <- prometheus.MustNewConstMetric(c.energy, prometheus.CounterValue, float64(uj)/1e6, kind, prov)
		}
	}
	var (
		parked    []string
		parkedErr error
	)
	for _, ph := range []record.Phase{record.PhaseExecuting, record.PhaseParked, record.PhaseClosed} {
		ids, err := c.src.Runs(ph)
		if ph == record.PhaseParked {
			parked, parkedErr = ids, err
		}
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.runs, fmt.Errorf("%s runs: %w", ph, err))
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.runs, prometheus.GaugeValue, float64(len(ids)), ph.String())
	}

	coeffs := c.src.Coefficients()
	var retained int64
	err := parkedErr
	if err == nil {
		retained, err = c.retainedBy(parked)
	}
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.retained, err)
		ch <- prometheus.NewInvalidMetric(c.draw, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.retained, prometheus.GaugeValue, float64(retained))
		// Storage draw is never measured (RAPL does not see disks), and
		// no park leaves memory resident: the draw is an estimate.
		ch <- prometheus.MustNewConstMetric(c.draw, prometheus.GaugeValue,
			drawWatts(uint64(retained), 0, coeffs.StorageWattsPerTB, coeffs.DRAMWattsPerGB),
			record.Estimated.String())
	}

	snap := c.src.Snapshot()
	avail := 0.0
	if snap.Available {
		avail = 1
	}
	ch <- prometheus.MustNewConstMetric(c.rapl, prometheus.GaugeValue, avail)
	ch <- prometheus.MustNewConstMetric(c.receipts, prometheus.CounterValue, float64(snap.MeasuredReceipts), record.Measured.String())
	ch <- prometheus.MustNewConstMetric(c.receipts, prometheus.CounterValue, float64(snap.EstimatedReceipts), record.Estimated.String())
}

// retainedBy sums the bytes the parked runs' snapshots retain, each run's
// as its resume will charge it: an object two parks name (the store keeps
// it once) counts for each. A run that is no longer parked when it is read
// (resumed or closed since the phase index was read) is left out.
func (c *collector) retainedBy(ids []string) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sizes := make(map[string]int64, len(ids))
	var total int64
	for _, id := range ids {
		st, err := c.src.Run(id)
		if errors.Is(err, store.ErrNoRun) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("run %s: %w", id, err)
		}
		if st.Phase != record.PhaseParked {
			continue
		}
		key := st.Parked.String()
		n, ok := c.sizes[key]
		if !ok {
			if n, err = c.src.Retained(st.Parked); err != nil {
				// Closed in the meantime, and its objects collected?
				if now, rerr := c.src.Run(id); rerr == nil && now.Phase != record.PhaseParked {
					continue
				}
				return 0, fmt.Errorf("run %s: retained bytes: %w", id, err)
			}
		}
		sizes[key] = n
		total += n
	}
	c.sizes = sizes // forget the parks that ended
	return total, nil
}

// drawWatts is the power retained and resident bytes draw, in watts:
// retained × storage W/TB / 10¹² + resident × DRAM W/GB / 10⁹. It computes
// as idle.Estimate does, exactly: each coefficient at its shortest decimal
// form as a rational (1.2 is 6/5), rounded to a float once.
func drawWatts(retained, resident uint64, storageWattsPerTB, dramWattsPerGB float64) float64 {
	w := new(big.Rat).Mul(new(big.Rat).SetUint64(retained), figureRat(storageWattsPerTB))
	w.Quo(w, big.NewRat(1e12, 1))
	if resident > 0 {
		r := new(big.Rat).Mul(new(big.Rat).SetUint64(resident), figureRat(dramWattsPerGB))
		w.Add(w, r.Quo(r, big.NewRat(1e9, 1)))
	}
	f, _ := w.Float64()
	return f
}

// figureRat is a coefficient as the exact rational of its shortest decimal
// form.
func figureRat(f float64) *big.Rat {
	if r, ok := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64)); ok {
		return r
	}
	return new(big.Rat) // not finite: Validate refuses such coefficients
}
