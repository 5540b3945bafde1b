package daemon

import (
	"testing"

	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/testhost"
)

// metricsHost is a daemon with only a real store and a real meter over
// internal/idle's host tree (internal/testhost), for tests that need no
// sandbox; fake_test.go adds the rest.
type metricsHost struct {
	d *Daemon
	*testhost.Fixture
}

func mustMetricsHost(t *testing.T, raplCase string, c ...idle.Coefficients) metricsHost {
	t.Helper()
	h := testhost.New(t, raplCase, c...)
	d := &Daemon{log: testhost.Log(t), st: h.Store, meter: h.Meter, runs: &runTable{st: h.Store}}
	// alone, until a test puts it in a fleet (inFleet)
	d.wire()
	return metricsHost{d: d, Fixture: h}
}
