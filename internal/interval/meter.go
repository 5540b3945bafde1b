package interval

import (
	"time"

	"github.com/runrecordd/runrecordd/internal/idle"
)

// IdleMeter is the host's meter (*idle.Meter) as an interval's [Meter].
type IdleMeter struct{ M *idle.Meter }

// CgroupOf is the cgroup of the process pid.
func (r IdleMeter) CgroupOf(pid int) (string, error) { return r.M.CgroupOf(pid) }

// Begin meters cg from now.
func (r IdleMeter) Begin(cg string) (Metering, error) {
	iv, err := r.M.Begin(cg)
	if err != nil {
		return nil, err
	}
	return iv, nil
}

// Reattach goes on metering cg from start, when its CPU time was cpuNS.
func (r IdleMeter) Reattach(cg string, start time.Time, cpuNS uint64) (Metering, error) {
	iv, err := r.M.Reattach(cg, start, cpuNS)
	if err != nil {
		return nil, err
	}
	return iv, nil
}
