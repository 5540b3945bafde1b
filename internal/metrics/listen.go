package metrics

import (
	"log/slog"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// runLabels are label names that would name a run, a call, a unit or an
// image: no metric of the scrape listener may carry one (a run id is
// cardinality without bound, and the id, like anything a unit wrote, is
// not the scraper's to see).
var runLabels = []string{"run", "run_id", "id", "call", "call_id", "unit", "image", "path"}

// ScrapeHandler is the /metrics handler of serve --metrics-listen: the
// registry of Handler, less any family that carries a label of runLabels
// (none today; a later metric that did would be left out, and logged,
// rather than served to a scraper).
func (m *Metrics) ScrapeHandler(src Source, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	return promhttp.HandlerFor(withoutRunLabels(m.Registry(src), log), promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// withoutRunLabels is reg's families less those with a label of runLabels.
func withoutRunLabels(reg prometheus.Gatherer, log *slog.Logger) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := reg.Gather()
		return slices.DeleteFunc(mfs, func(mf *dto.MetricFamily) bool {
			for _, mt := range mf.GetMetric() {
				for _, l := range mt.GetLabel() {
					if slices.Contains(runLabels, l.GetName()) {
						log.Error("metrics: a family with a run's label is not served to the scrape listener", "family", mf.GetName(), "label", l.GetName())
						return true
					}
				}
			}
			return false
		}), err
	})
}

// Listener is the whole of serve --metrics-listen's HTTP handler: GET (or
// HEAD) /metrics answers h; any other path is 404, any other method 405.
func Listener(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}
