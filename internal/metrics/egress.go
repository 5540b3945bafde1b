package metrics

import "github.com/prometheus/client_golang/prometheus"

// metricEgressBytes counts the bytes recorded in the traffic entries of
// the intervals this process recorded (docs/operations.md, "Metrics").
const metricEgressBytes = "runrecordd_egress_bytes_total"

func newEgressBytes() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricEgressBytes,
		Help: "IPv4 bytes through runs' egress links, as the intervals recorded by this process journaled them, by direction (in: to the sandbox, out: from it)."},
		[]string{"direction"})
}

// Traffic counts an interval's journaled traffic (once it is recorded):
// in bytes to the sandbox, out bytes from it.
func (m *Metrics) Traffic(in, out uint64) {
	m.init()
	m.egressBytes.WithLabelValues("in").Add(float64(in))
	m.egressBytes.WithLabelValues("out").Add(float64(out))
}
