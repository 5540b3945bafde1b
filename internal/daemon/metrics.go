package daemon

import (
	"net/http"

	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Metrics is the /metrics handler (internal/metrics).
func (d *Daemon) Metrics() http.Handler { return d.metrics.Handler(metricsSource{d}, d.log) }

// metricsSource is what a scrape reads of the daemon.
type metricsSource struct{ d *Daemon }

func (s metricsSource) Runs(p record.Phase) ([]string, error) { return s.d.st.Runs(p) }
func (s metricsSource) Run(id string) (store.Run, error)      { return s.d.st.Run(id) }
func (s metricsSource) Retained(snap record.Snapshot) (int64, error) {
	return park.Retained(s.d.st, snap)
}
func (s metricsSource) Coefficients() idle.Coefficients { return s.d.meter.Coefficients() }
func (s metricsSource) Snapshot() idle.Snapshot         { return s.d.meter.Snapshot() }
