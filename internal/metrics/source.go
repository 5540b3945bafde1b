package metrics

import (
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// HostSource is what a scrape reads of a host: its store's runs and their
// retained snapshots, and its meter.
func HostSource(st *store.Store, m *idle.Meter) Source { return hostSource{st, m} }

type hostSource struct {
	*store.Store
	m *idle.Meter
}

func (s hostSource) Retained(snap record.Snapshot) (int64, error) {
	return park.Retained(s.Store, snap)
}
func (s hostSource) Coefficients() idle.Coefficients { return s.m.Coefficients() }
func (s hostSource) Snapshot() idle.Snapshot         { return s.m.Snapshot() }
