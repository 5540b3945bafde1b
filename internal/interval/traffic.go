package interval

import "github.com/runrecordd/runrecordd/pkg/attest"

// Counters are a run's egress link's counts on this host, as the host's
// rules hold them: they only grow while the run's rules stay installed.
type Counters struct {
	InBytes    uint64 `json:"in_bytes"`
	InPackets  uint64 `json:"in_packets"`
	OutBytes   uint64 `json:"out_bytes"`
	OutPackets uint64 `json:"out_packets"`
}

// Traffic reads runs' egress counters on this host (the daemon's links).
type Traffic interface {
	// Counters is run's counts now; false when run holds no egress link
	// here. A run whose rules are gone (the host restarted) counts zero.
	Counters(run string) (Counters, bool, error)
}

// trafficOf is the traffic entry's data for an interval that began at
// start (nil: the run held no link then, so zero) and ends at now. Counts
// below their start mean the counters were reset (the host restarted):
// the interval counts what they hold, and says so.
func trafficOf(start *Counters, now Counters) attest.Traffic {
	var s Counters
	if start != nil {
		s = *start
	}
	if now.InBytes < s.InBytes || now.InPackets < s.InPackets || now.OutBytes < s.OutBytes || now.OutPackets < s.OutPackets {
		return attest.Traffic{InBytes: now.InBytes, InPackets: now.InPackets, OutBytes: now.OutBytes, OutPackets: now.OutPackets, Reset: true}
	}
	return attest.Traffic{InBytes: now.InBytes - s.InBytes, InPackets: now.InPackets - s.InPackets,
		OutBytes: now.OutBytes - s.OutBytes, OutPackets: now.OutPackets - s.OutPackets}
}
