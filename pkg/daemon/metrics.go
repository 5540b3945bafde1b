package daemon

import (
	"net/http"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// metrics are the daemon's counters since it started, for /metrics.
type metrics struct {
	mu        sync.Mutex
	activeUJ  [3]uint64 // by provenance: [record.Measured], [record.Estimated]
	idleUJ    [3]uint64
	parks     []time.Duration
	resumes   []time.Duration
	parkCount uint64
	resumeCnt uint64
}

func (m *metrics) receipt(rc attest.Receipt) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if int(rc.Provenance) < len(m.activeUJ) {
		m.activeUJ[rc.Provenance] += rc.UJ
	}
}

func (m *metrics) parked(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.parkCount++
	m.parks = append(m.parks, d)
}

func (m *metrics) resumed(d time.Duration, uj uint64, p record.Provenance) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.resumeCnt++
	m.resumes = append(m.resumes, d)
	if int(p) < len(m.idleUJ) {
		m.idleUJ[p] += uj
	}
}

// Metrics is the /metrics handler.
func (d *Daemon) Metrics() http.Handler {
	return http.NotFoundHandler()
}
