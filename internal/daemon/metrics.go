package daemon

import (
	"net/http"

	"github.com/runrecordd/runrecordd/internal/metrics"
)

// Metrics is the /metrics handler (internal/metrics).
func (d *Daemon) Metrics() http.Handler {
	return d.metrics.Handler(metrics.HostSource(d.st, d.meter), d.log)
}
