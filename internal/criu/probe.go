package criu

import "time"

// Probe is what a real checkpoint and restore on this host showed. `criu
// check` is not enough: CRIU 4.1.1 passes it on machines where every dump
// then hangs.
type Probe struct {
	// OK is set when both a plain process and a container were dumped and
	// restored, each within the deadline, and came back running.
	OK bool
	// Reason says why image parks are unavailable, when not OK.
	Reason string
	// Notes are what CRIU reported about this host on the way, in words
	// (for example that it works with hardware breakpoints off).
	Notes []string
	// Took is the whole probe.
	Took time.Duration
	// Seen is what CRIU's logs showed the build doing that upstream CRIU
	// does not (internal/executor, probe_criu.go).
	Seen []Capability
	// UserNSTried is set when the probe also dumped and restored a
	// container in a user namespace (executor.Config.ProbeUserNS), after
	// the others passed; UserNS when that passed, UserNSReason why not.
	UserNSTried  bool
	UserNS       bool
	UserNSReason string
}
