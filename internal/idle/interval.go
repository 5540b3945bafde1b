package idle

import (
	"fmt"
	"math/big"
	"strconv"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Interval is one executed interval of a sandbox, from [Meter.Begin] to
// [Interval.End].
type Interval struct {
	m     *Meter
	path  string
	file  string
	begin point
	cpu   uint64

	mu    sync.Mutex
	ended bool
}

// Begin starts metering the sandbox whose cgroup is at cgroupPath
// (relative to the hierarchy, as in /proc/<pid>/cgroup; see
// [Meter.CgroupOf]). Call it when the sandbox starts or is restored. It
// fails, with [ErrCgroup], only when the cgroup's CPU time cannot be read.
func (m *Meter) Begin(cgroupPath string) (*Interval, error) {
	file, err := cgroupFile(m.cgroupRoot, m.mode, cgroupPath)
	if err != nil {
		return nil, err
	}
	p := m.point()
	cpu, err := readCgroupNS(m.mode, file)
	if err != nil {
		return nil, fmt.Errorf("begin %s: %w", cgroupPath, err)
	}
	return &Interval{m: m, path: cgroupPath, file: file, begin: p, cpu: cpu}, nil
}

// Reattach goes on metering an interval that an earlier process began at
// start, when the sandbox's cgroup had used cpuNS ([Interval.CPUAtBegin]).
// The earlier process's RAPL and host counters are gone, so the receipt
// [Interval.End] gives is estimated from the cgroup's CPU time, with the
// reason under "fallback".
func (m *Meter) Reattach(cgroupPath string, start time.Time, cpuNS uint64) (*Interval, error) {
	file, err := cgroupFile(m.cgroupRoot, m.mode, cgroupPath)
	if err != nil {
		return nil, err
	}
	const why = "the interval began in an earlier daemon process, whose counters were not kept"
	p := point{at: start, hostErr: why}
	m.mu.Lock()
	for range m.zones {
		p.totals = append(p.totals, 0)
		p.faults = append(p.faults, 0)
		p.errs = append(p.errs, why)
	}
	m.mu.Unlock()
	return &Interval{m: m, path: cgroupPath, file: file, begin: p, cpu: cpuNS}, nil
}

// CPUAtBegin is the cgroup's CPU time when the interval began.
func (iv *Interval) CPUAtBegin() uint64 { return iv.cpu }

// End ends the interval and returns its receipt: measured (RAPL package
// and DRAM energy over the interval × the sandbox's share of host busy CPU
// time) when every zone was read without fault across the interval and
// host CPU time was readable at both ends, and estimated (the sandbox's
// CPU time × CPUWatts, with the reason under "fallback") otherwise.
//
// Call End while the cgroup still exists: at park after the checkpoint,
// at exit before the task is deleted. If the cgroup cannot be read, End
// returns an [ErrCgroup] error and the interval stays open, so End may be
// called again.
func (iv *Interval) End() (attest.Receipt, error) {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	if iv.ended {
		return attest.Receipt{}, ErrEnded
	}
	end := iv.m.point()
	cpu, err := readCgroupNS(iv.m.mode, iv.file)
	if err != nil {
		return attest.Receipt{}, fmt.Errorf("end %s: %w", iv.path, err)
	}
	iv.ended = true
	if cpu < iv.cpu {
		return attest.Receipt{}, fmt.Errorf("end %s: %w: usage went from %d to %d ns (cgroup recreated?)", iv.path, ErrCgroup, iv.cpu, cpu)
	}
	return iv.m.receipt(iv, end, cpu-iv.cpu), nil
}

func (m *Meter) receipt(iv *Interval, end point, cpu uint64) attest.Receipt {
	r := attest.Receipt{
		CPUNS:    cpu,
		WindowNS: durationNS(end.at.Sub(iv.begin.at)),
		Inputs:   map[string]string{"cgroup": string(m.mode) + ":" + iv.path},
	}
	reason := m.zoneFallback(iv.begin, end, anyZone)
	switch {
	case reason != "":
	case iv.begin.hostErr != "":
		reason = iv.begin.hostErr
	case end.hostErr != "":
		reason = end.hostErr
	case end.host < iv.begin.host:
		reason = fmt.Sprintf("host busy cpu time went backwards, from %d to %d ticks", iv.begin.host, end.host)
	}
	if reason == "" {
		energy := m.energy(iv.begin, end, anyZone)
		host := (end.host - iv.begin.host) * tickNS
		r.Provenance = record.Measured
		r.Method = MethodRAPLShare
		r.Inputs["rapl_zones"] = m.zoneLabels(anyZone)
		r.Inputs["rapl_uj"] = strconv.FormatUint(energy, 10)
		r.Inputs["host_busy_ns"] = strconv.FormatUint(host, 10)
		r.Inputs["host_busy_fields"] = HostBusyFields
		switch {
		case cpu == 0:
			r.UJ = 0
		case cpu >= host:
			// /proc/stat counts in 10 ms ticks, the cgroup in ns: over a
			// short window the sandbox can appear to have used more than
			// the host. Its share is then at most everything.
			r.UJ = energy
			r.Inputs["cpu_share_capped"] = "true"
		default:
			share := new(big.Rat).SetFrac(
				new(big.Int).Mul(new(big.Int).SetUint64(energy), new(big.Int).SetUint64(cpu)),
				new(big.Int).SetUint64(host))
			r.UJ, _ = ceilUJ(share) // at most energy: cannot saturate
		}
	} else {
		c := m.coeffs
		r.Provenance = record.Estimated
		r.Method = MethodCPUCoefficient
		r.Inputs["cpu_watts"] = formatFigure(c.CPUWatts)
		r.Inputs["fallback"] = reason
		var saturated bool
		if r.UJ, saturated = ceilUJ(cpuUJ(cpu, c.CPUWatts)); saturated {
			r.Inputs["saturated"] = "true"
		}
	}
	m.mu.Lock()
	if r.Provenance == record.Measured {
		m.measured++
	} else {
		m.estimated++
		m.lastFallback = reason
	}
	m.mu.Unlock()
	return r
}
