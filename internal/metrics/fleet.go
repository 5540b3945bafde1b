package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The fleet's metrics (docs/operations.md, "Metrics").
const (
	metricMigrations      = "runrecordd_migrations_total"
	metricMigrationTime   = "runrecordd_migration_duration_seconds"
	metricDrainRuns       = "runrecordd_drain_runs_total"
	metricOwnershipRefuse = "runrecordd_ownership_refusals_total"
)

// fleetMetrics count migrations, drains and the fleet's refusals.
type fleetMetrics struct {
	migrations *prometheus.CounterVec // direction, outcome
	took       prometheus.Histogram   // a migration out that succeeded
	drained    *prometheus.CounterVec // outcome
	refusals   prometheus.Counter
}

func newFleetMetrics() fleetMetrics {
	return fleetMetrics{
		migrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricMigrations,
			Help: "Migrations by direction (out: this host handed a run over; in: it received one) and outcome (ok, failed)."},
			[]string{"direction", "outcome"}),
		took: prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricMigrationTime,
			Help: "Time a successful migration out took, park and the target's receipt (and resume) included, in seconds.", Buckets: durationBuckets()}),
		drained: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricDrainRuns,
			Help: "Runs a drain of this host moved (moved) or could not move (left)."}, []string{"outcome"}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{Name: metricOwnershipRefuse,
			Help: "Transitions the fleet refused this host: another host owns the run, the directory's head moved, or this host's lease is lost."}),
	}
}

func (f fleetMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{f.migrations, f.took, f.drained, f.refusals}
}

// Migrated counts a migration: out (this host handed the run over) or in.
func (m *Metrics) Migrated(out, ok bool, took time.Duration) {
	m.init()
	dir, outcome := "in", "ok"
	if out {
		dir = "out"
	}
	if !ok {
		outcome = "failed"
	}
	m.fleet.migrations.WithLabelValues(dir, outcome).Inc()
	if out && ok {
		m.fleet.took.Observe(took.Seconds())
	}
}

// Drained counts a run a drain moved, or left here.
func (m *Metrics) Drained(moved bool) {
	m.init()
	outcome := "moved"
	if !moved {
		outcome = "left"
	}
	m.fleet.drained.WithLabelValues(outcome).Inc()
}

// OwnershipRefused counts a transition the fleet refused.
func (m *Metrics) OwnershipRefused() {
	m.init()
	m.fleet.refusals.Inc()
}
