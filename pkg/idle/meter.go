package idle

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Errors returned by this package.
var (
	// ErrCgroup: a sandbox's cgroup CPU time cannot be read (no such
	// cgroup, a file that does not parse, a counter that went backwards),
	// or no cgroup hierarchy was found.
	ErrCgroup = errors.New("cgroup cpu time")
	// ErrCoefficients: a coefficient that is not finite and positive, or
	// JSON that does not decode into Coefficients.
	ErrCoefficients = errors.New("invalid coefficients")
	// ErrConfig: a Config the meter cannot run with.
	ErrConfig = errors.New("invalid meter config")
	// ErrEnded: End called on an interval that already ended.
	ErrEnded = errors.New("interval already ended")
)

// Methods, as receipts and idle inputs name them.
const (
	MethodRAPLShare       = "rapl-share"                 // measured: RAPL energy × CPU share
	MethodCPUCoefficient  = "cpu-time-coefficient"       // estimated: CPU time × CPUWatts
	MethodIdleCoefficient = "retained-bytes-coefficient" // estimated: bytes × coefficient × time
	MethodIdleDRAMShare   = "dram-rapl-share"            // measured: RAPL DRAM energy × resident share
)

// Defaults for a zero Config.
const (
	DefaultSysfsRoot  = "/sys"
	DefaultProcfsRoot = "/proc"
	DefaultCgroupRoot = "/sys/fs/cgroup"
	DefaultPeriod     = 10 * time.Second
	// DefaultMaxGapPeriods × Period is the default MaxGap.
	DefaultMaxGapPeriods = 6
)

// Config configures a [Meter]. The zero Config meters this host with the
// defaults.
type Config struct {
	SysfsRoot  string     // sysfs mount; RAPL zones are under class/powercap. Default /sys.
	ProcfsRoot string     // procfs mount, for stat, meminfo and <pid>/cgroup. Default /proc.
	CgroupRoot string     // cgroup mount. Default /sys/fs/cgroup.
	Cgroup     CgroupMode // which hierarchy to read; default CgroupAuto.

	// Period is how often Run samples the RAPL counters. It must be well
	// under the time a counter takes to wrap (minutes on a busy host).
	// Default 10 s.
	Period time.Duration
	// MaxGap is the longest time between two samples over which a zone's
	// total is trusted; an interval spanning a longer gap is estimated.
	// Default 6 × Period.
	MaxGap time.Duration

	// Coefficients for estimation; the zero value means the defaults.
	Coefficients Coefficients
}

// Meter meters sandboxes' energy on one host. It follows the host's RAPL
// package and DRAM zones with wrap-safe totals, reads host CPU time from
// /proc/stat and a sandbox's from its cgroup. Its methods are safe for
// concurrent use.
type Meter struct {
	proc       procfs.FS
	cgroupRoot string
	mode       CgroupMode
	period     time.Duration
	maxGap     time.Duration
	coeffs     Coefficients
	now        func() time.Time // the clock; tests replace it

	zones      []*zone // fixed at NewMeter; mutable fields under mu
	raplReason string  // why there are no zones

	mu           sync.Mutex
	samples      uint64
	lastSample   time.Time
	measured     uint64
	estimated    uint64
	lastFallback string
}

// NewMeter discovers the host's RAPL zones, detects the cgroup hierarchy
// and takes a first sample. A host without usable RAPL is not an error:
// the meter then estimates every receipt and [Meter.Snapshot] says why.
func NewMeter(cfg Config) (*Meter, error) {
	if cfg.SysfsRoot == "" {
		cfg.SysfsRoot = DefaultSysfsRoot
	}
	if cfg.ProcfsRoot == "" {
		cfg.ProcfsRoot = DefaultProcfsRoot
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = DefaultCgroupRoot
	}
	if cfg.Period == 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.Period < 0 {
		return nil, fmt.Errorf("%w: period %s", ErrConfig, cfg.Period)
	}
	if cfg.MaxGap == 0 {
		cfg.MaxGap = DefaultMaxGapPeriods * cfg.Period
	}
	if cfg.MaxGap < cfg.Period {
		return nil, fmt.Errorf("%w: max gap %s shorter than period %s", ErrConfig, cfg.MaxGap, cfg.Period)
	}
	if cfg.Coefficients == (Coefficients{}) {
		cfg.Coefficients = DefaultCoefficients()
	}
	if err := cfg.Coefficients.Validate(); err != nil {
		return nil, err
	}
	proc, err := procfs.NewFS(cfg.ProcfsRoot)
	if err != nil {
		return nil, fmt.Errorf("%w: procfs: %w", ErrConfig, err)
	}
	mode, err := detectCgroup(cfg.CgroupRoot, cfg.Cgroup)
	if err != nil {
		return nil, err
	}
	m := &Meter{
		proc:       proc,
		cgroupRoot: cfg.CgroupRoot,
		mode:       mode,
		period:     cfg.Period,
		maxGap:     cfg.MaxGap,
		coeffs:     cfg.Coefficients,
		now:        time.Now,
	}
	m.zones, m.raplReason = discover(cfg.SysfsRoot)
	m.Sample()
	return m, nil
}

// Coefficients returns the coefficients the meter estimates with.
func (m *Meter) Coefficients() Coefficients { return m.coeffs }

// Run samples the RAPL counters every Period until ctx is done, and
// returns ctx's error. Run it for the life of the daemon: a counter that
// wraps twice between samples loses a whole range, and intervals across a
// gap longer than MaxGap are estimated.
func (m *Meter) Run(ctx context.Context) error {
	t := time.NewTicker(m.period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			m.Sample()
		}
	}
}

// Sample reads every RAPL zone once now. Run calls it every Period;
// Begin and End call it at the interval's edges.
func (m *Meter) Sample() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sampleLocked()
}

func (m *Meter) sampleLocked() time.Time {
	now := m.now()
	if len(m.zones) == 0 {
		return now
	}
	if !m.lastSample.IsZero() {
		if d := now.Sub(m.lastSample); d > m.maxGap {
			for _, z := range m.zones {
				z.gap(d, m.maxGap)
			}
		}
	}
	for _, z := range m.zones {
		z.read()
	}
	m.samples++
	m.lastSample = now
	return now
}

// point is the meter's state at one instant: each zone's total, fault
// count and read error, and the host's busy CPU time.
type point struct {
	at      time.Time
	totals  []uint64
	faults  []uint64
	errs    []string
	host    uint64 // busy ticks
	hostErr string
}

func (m *Meter) point() point {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := point{at: m.sampleLocked()}
	for _, z := range m.zones {
		p.totals = append(p.totals, z.total)
		p.faults = append(p.faults, z.faults)
		p.errs = append(p.errs, z.err)
	}
	host, err := hostBusyTicks(m.proc)
	if err != nil {
		p.hostErr = fmt.Sprintf("host cpu time: %v", err)
	}
	p.host = host
	return p
}

// zoneFallback returns why the zones for which use is true cannot be
// trusted from begin to end, or "" if they can.
func (m *Meter) zoneFallback(begin, end point, use func(*zone) bool) string {
	if len(m.zones) == 0 {
		return "rapl unavailable: " + m.raplReason
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, z := range m.zones {
		if !use(z) {
			continue
		}
		switch {
		case begin.errs[i] != "":
			return "rapl unreadable at start: " + begin.errs[i]
		case end.errs[i] != "":
			return "rapl unreadable at end: " + end.errs[i]
		case end.faults[i] != begin.faults[i]:
			return fmt.Sprintf("rapl fault during the interval (%d): %s", end.faults[i]-begin.faults[i], z.lastFault)
		}
	}
	return ""
}

func (m *Meter) zoneLabels(use func(*zone) bool) string {
	var l []string
	for _, z := range m.zones {
		if use(z) {
			l = append(l, z.label())
		}
	}
	return strings.Join(l, ",")
}

func (m *Meter) energy(begin, end point, use func(*zone) bool) uint64 {
	var e uint64
	for i, z := range m.zones {
		if use(z) {
			e += end.totals[i] - begin.totals[i]
		}
	}
	return e
}

func anyZone(*zone) bool    { return true }
func dramZone(z *zone) bool { return z.domain == domainDRAM }

// CgroupOf returns the path of pid's cgroup in the hierarchy the meter
// reads, from /proc/<pid>/cgroup, for [Meter.Begin].
func (m *Meter) CgroupOf(pid int) (string, error) { return cgroupOf(m.proc, m.mode, pid) }

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

// Park is one park on this host, from [Meter.BeginPark] to [Park.End].
type Park struct {
	m     *Meter
	begin point
}

// BeginPark marks the start of a park, so that [Park.End] can measure the
// DRAM the park leaves resident. A park resumed elsewhere, or after the
// daemon restarted, has no Park: its idle energy is [Estimate]d.
func (m *Meter) BeginPark() *Park { return &Park{m: m, begin: m.point()} }

// End returns the park's idle energy, as [Estimate] does, for a park that
// retained retainedBytes in storage and left residentBytes resident, over
// the time since BeginPark. Storage is always estimated: RAPL does not
// see disks. Resident memory is measured — the RAPL DRAM zones' energy
// over the park × residentBytes / MemTotal — when the host has DRAM zones
// read without fault across the park; otherwise it is estimated too, with
// the reason under "fallback". The figure is labelled measured only when
// nothing in it was estimated.
func (p *Park) End(retainedBytes, residentBytes uint64) (uint64, record.Provenance, map[string]string) {
	m := p.m
	end := m.point()
	parked := end.at.Sub(p.begin.at)
	if residentBytes == 0 {
		return Estimate(retainedBytes, 0, parked, m.coeffs)
	}
	reason := ""
	if !hasDRAM(m.zones) {
		reason = "rapl unavailable: no RAPL DRAM zone"
		if len(m.zones) == 0 {
			reason = "rapl unavailable: " + m.raplReason
		}
	} else {
		reason = m.zoneFallback(p.begin, end, dramZone)
	}
	memTotal, err := memTotalBytes(m.proc)
	if reason == "" && err != nil {
		reason = fmt.Sprintf("meminfo: %v", err)
	}
	if reason != "" {
		uj, prov, in := Estimate(retainedBytes, residentBytes, parked, m.coeffs)
		in["fallback"] = reason
		return uj, prov, in
	}
	ns := durationNS(parked)
	dram := m.energy(p.begin, end, dramZone)
	resident := min(residentBytes, memTotal)
	in := map[string]string{
		"method":          MethodIdleDRAMShare,
		"retained_bytes":  strconv.FormatUint(retainedBytes, 10),
		"resident_bytes":  strconv.FormatUint(residentBytes, 10),
		"parked_ns":       strconv.FormatUint(ns, 10),
		"dram":            record.Measured.String(),
		"rapl_zones":      m.zoneLabels(dramZone),
		"dram_rapl_uj":    strconv.FormatUint(dram, 10),
		"mem_total_bytes": strconv.FormatUint(memTotal, 10),
	}
	total := new(big.Rat).SetFrac(
		new(big.Int).Mul(new(big.Int).SetUint64(dram), new(big.Int).SetUint64(resident)),
		new(big.Int).SetUint64(memTotal))
	prov := record.Measured
	if retainedBytes > 0 {
		in["method"] = MethodIdleCoefficient
		in["storage_watts_per_tb"] = formatFigure(m.coeffs.StorageWattsPerTB)
		total.Add(total, storageUJ(retainedBytes, ns, m.coeffs.StorageWattsPerTB))
		prov = record.Estimated
	}
	return finishIdle(total, retainedBytes, residentBytes, ns, in), prov, in
}

func hasDRAM(zones []*zone) bool {
	for _, z := range zones {
		if z.domain == domainDRAM {
			return true
		}
	}
	return false
}

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
