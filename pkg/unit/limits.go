package unit

// Limits caps what a unit may hold or make the daemon hold. A zero field
// asks for the daemon's default (DefaultLimits, docs/limits.md); a grant set
// that sets none has the canonical bytes it had before limits existed.
type Limits struct {
	Pids                 uint32 `json:"pids,omitempty"`                   // processes and threads in the sandbox
	LogBytes             uint64 `json:"log_bytes,omitempty"`              // stdout and stderr, each
	TranscriptBytes      uint64 `json:"transcript_bytes,omitempty"`       // the transcript's size
	ChannelConns         uint32 `json:"channel_conns,omitempty"`          // connections open at once on the channel
	ChannelInflightBytes uint64 `json:"channel_inflight_bytes,omitempty"` // unanswered request bytes held across the channel's connections
	IntervalCalls        uint32 `json:"interval_calls,omitempty"`         // calls dispatched in one interval
	IntervalPayloadBytes uint64 `json:"interval_payload_bytes,omitempty"` // append and dispatch payload bytes in one interval
	SnapshotBytes        uint64 `json:"snapshot_bytes,omitempty"`         // the run's snapshot images, all parks together
}

// DefaultLimits are the daemon's limits where a grant set leaves one zero.
var DefaultLimits = Limits{
	Pids:                 1024,
	LogBytes:             64 << 20,
	TranscriptBytes:      256 << 20,
	ChannelConns:         16,
	ChannelInflightBytes: 8 << 20,
	IntervalCalls:        4096,
	IntervalPayloadBytes: 256 << 20,
	SnapshotBytes:        16 << 30,
}

// IsZero reports whether l sets no limit.
func (l Limits) IsZero() bool { return l == Limits{} }

// Or returns l with each zero field taken from def.
func (l Limits) Or(def Limits) Limits {
	pick32 := func(a, b uint32) uint32 {
		if a != 0 {
			return a
		}
		return b
	}
	pick64 := func(a, b uint64) uint64 {
		if a != 0 {
			return a
		}
		return b
	}
	return Limits{
		Pids:                 pick32(l.Pids, def.Pids),
		LogBytes:             pick64(l.LogBytes, def.LogBytes),
		TranscriptBytes:      pick64(l.TranscriptBytes, def.TranscriptBytes),
		ChannelConns:         pick32(l.ChannelConns, def.ChannelConns),
		ChannelInflightBytes: pick64(l.ChannelInflightBytes, def.ChannelInflightBytes),
		IntervalCalls:        pick32(l.IntervalCalls, def.IntervalCalls),
		IntervalPayloadBytes: pick64(l.IntervalPayloadBytes, def.IntervalPayloadBytes),
		SnapshotBytes:        pick64(l.SnapshotBytes, def.SnapshotBytes),
	}
}
