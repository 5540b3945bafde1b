package idle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
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
