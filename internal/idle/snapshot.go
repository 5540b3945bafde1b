package idle

import "time"

// Snapshot is the meter's state for /metrics and the API.
type Snapshot struct {
	// Available reports whether the host has RAPL package zones and every
	// zone read at the last sample.
	Available bool
	// Reasons says why not: the discovery failure, or each zone's last
	// read error.
	Reasons []string
	Zones   []ZoneSnapshot

	Samples    uint64
	LastSample time.Time
	Period     time.Duration
	MaxGap     time.Duration
	Cgroup     CgroupMode

	Coefficients Coefficients

	// Receipts produced so far, by provenance, and the reason for the
	// latest estimated one.
	MeasuredReceipts  uint64
	EstimatedReceipts uint64
	LastFallback      string
}

// ZoneSnapshot is one RAPL zone's state.
type ZoneSnapshot struct {
	ID      string // directory under class/powercap, e.g. "intel-rapl:0"
	Name    string // e.g. "package-0"
	Domain  string // "package" or "dram"
	TotalUJ uint64 // energy since the meter started, wrap-corrected
	RangeUJ uint64 // max_energy_range_uj
	Wraps   uint64
	Faults  uint64 // failed reads and sample gaps
	// LastFault is the most recent fault; Err the last read's failure,
	// empty when it succeeded.
	LastFault string
	Err       string
}

// Snapshot returns the meter's current state.
func (m *Meter) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Snapshot{
		Samples:           m.samples,
		LastSample:        m.lastSample,
		Period:            m.period,
		MaxGap:            m.maxGap,
		Cgroup:            m.mode,
		Coefficients:      m.coeffs,
		MeasuredReceipts:  m.measured,
		EstimatedReceipts: m.estimated,
		LastFallback:      m.lastFallback,
	}
	if len(m.zones) == 0 {
		s.Reasons = []string{m.raplReason}
	}
	for _, z := range m.zones {
		s.Zones = append(s.Zones, ZoneSnapshot{
			ID: z.id, Name: z.name, Domain: z.domain,
			TotalUJ: z.total, RangeUJ: z.rangeUJ, Wraps: z.wraps,
			Faults: z.faults, LastFault: z.lastFault, Err: z.err,
		})
		if z.err != "" {
			s.Reasons = append(s.Reasons, z.err)
		}
	}
	s.Available = len(s.Reasons) == 0
	return s
}
