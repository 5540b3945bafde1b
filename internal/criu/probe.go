package criu

import (
	"bytes"
	"time"
)

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
	// does not ([Probe.ReadLogs]).
	Seen []Capability
	// UserNSTried is set when the probe also dumped and restored a
	// container in a user namespace (executor.Config.ProbeUserNS), after
	// the others passed; UserNS when that passed, UserNSReason why not.
	UserNSTried  bool
	UserNS       bool
	UserNSReason string
}

// breakpointsOff is what CRIU >= 4.2 logs when a machine's hardware
// breakpoints do not fire (some virtual machines); it then goes on without
// them, where 4.1 waited forever.
const breakpointsOff = "Hardware breakpoints don't seem to work"

// probeMarks are the lines CRIU's logs (level 4, as runc and the probe run
// it) hold when a deploy/criu patch did its work: the container probe's
// /dev, /dev/shm and /run are small tmpfs mounts, dumped and restored in
// CRIU's own process by patches 4 and 3, through tar without them.
var probeMarks = []struct {
	c    Capability
	line string
}{
	{TmpfsDump, "dumped without tar"},
	{TmpfsRestore, "restored without tar"},
}

// ReadLogs sets what the probe's CRIU logs show: the build's capabilities
// seen at work (Seen), and a note when CRIU went on without hardware
// breakpoints.
func (p *Probe) ReadLogs(logs []byte) {
	if bytes.Contains(logs, []byte(breakpointsOff)) {
		p.Notes = append(p.Notes, "CRIU works with hardware breakpoints off (they do not fire on this machine)")
	}
	p.Seen = nil
	for _, m := range probeMarks {
		if bytes.Contains(logs, []byte(m.line)) {
			p.Seen = append(p.Seen, m.c)
		}
	}
}
