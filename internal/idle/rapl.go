package idle

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs/sysfs"
)

// RAPL domains the meter sums. The package domain includes its core and
// uncore subzones, so those are never added again; the DRAM domain is
// separate from the package's. The platform domain (psys) covers both and
// more, and is left out.
const (
	domainPackage = "package"
	domainDRAM    = "dram"
)

// zone is one RAPL zone the meter follows, with its wrap-safe total.
// Every field is guarded by the Meter's mutex.
type zone struct {
	id      string // directory name under class/powercap: "intel-rapl:0:2"
	name    string // name with index: "dram-0"
	domain  string // domainPackage or domainDRAM
	energy  string // path of energy_uj
	rangeUJ uint64 // max_energy_range_uj: the counter wraps past it

	primed bool   // last holds a reading
	last   uint64 // the last energy_uj read
	total  uint64 // µJ accumulated since the meter started, never decreasing
	wraps  uint64 // wraps seen

	faults    uint64 // failed reads and sample gaps, ever
	lastFault string // the most recent one
	err       string // the last read's failure; "" when it succeeded
}

// label is the zone as receipts name it: "intel-rapl:0=package-0".
func (z *zone) label() string { return z.id + "=" + z.name }

// discover finds the package and DRAM zones under root's class/powercap
// through procfs's sysfs reader. It returns a reason instead of zones when
// the host has no usable RAPL; a zone whose counter cannot be read is
// still returned, and its first sample records the fault.
func discover(sysRoot string) ([]*zone, string) {
	fs, err := sysfs.NewFS(sysRoot)
	if err != nil {
		return nil, fmt.Sprintf("sysfs: %v", err)
	}
	found, err := sysfs.GetRaplZones(fs)
	if err != nil {
		return nil, fmt.Sprintf("powercap: %v", err)
	}
	var zones []*zone
	var other []string
	for _, rz := range found {
		id := filepath.Base(rz.Path)
		label := rz.Name + "-" + strconv.Itoa(rz.Index)
		// intel-rapl-mmio zones are a second interface to the same package
		// counters (on client parts); counting them would count twice.
		if strings.HasPrefix(id, "intel-rapl-mmio") || (rz.Name != domainPackage && rz.Name != domainDRAM) {
			other = append(other, id+"="+label)
			continue
		}
		if rz.MaxMicrojoules == 0 {
			return nil, fmt.Sprintf("powercap zone %s (%s): max_energy_range_uj is 0, so a wrap cannot be undone", id, label)
		}
		zones = append(zones, &zone{
			id:      id,
			name:    label,
			domain:  rz.Name,
			energy:  filepath.Join(rz.Path, "energy_uj"),
			rangeUJ: rz.MaxMicrojoules,
		})
	}
	slices.SortFunc(zones, func(a, b *zone) int { return strings.Compare(a.id, b.id) })
	if !slices.ContainsFunc(zones, func(z *zone) bool { return z.domain == domainPackage }) {
		slices.Sort(other)
		seen := "none"
		if len(other) > 0 {
			seen = strings.Join(other, ",")
		}
		return nil, fmt.Sprintf("powercap: no RAPL package zone under %s (zones seen: %s)",
			filepath.Join(sysRoot, "class", "powercap"), seen)
	}
	return zones, ""
}

// read takes one reading of the zone's counter and adds the delta since the
// last one, modulo the counter's range, to its total.
//
// The counter counts up to max_energy_range_uj and starts again from zero.
// A reading below the last is taken as one wrap: the delta is
// (range − last) + reading. The true modulus is range plus one energy unit
// (sysfs does not expose the unit, 15.3–61 µJ on current parts), so each
// wrap undercounts by at most one unit. Two wraps between readings cannot
// be told from one; the sampling period and the gap check exist to rule
// them out.
func (z *zone) read() {
	data, err := os.ReadFile(z.energy)
	if err != nil {
		z.fault(fmt.Sprintf("zone %s: read energy_uj: %v", z.label(), err))
		return
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		z.fault(fmt.Sprintf("zone %s: parse %s: %v", z.label(), z.energy, err))
		return
	}
	if v > z.rangeUJ {
		z.fault(fmt.Sprintf("zone %s: energy_uj %d above max_energy_range_uj %d", z.label(), v, z.rangeUJ))
		return
	}
	z.err = ""
	if !z.primed {
		z.last, z.primed = v, true
		return
	}
	if v >= z.last {
		z.total += v - z.last
	} else {
		z.total += (z.rangeUJ - z.last) + v
		z.wraps++
	}
	z.last = v
}

func (z *zone) fault(msg string) {
	z.faults++
	z.lastFault = msg
	z.err = msg
}

// gap records that no reading was taken for longer than maxGap: a whole
// wrap may have passed unseen, so the total across the gap is not trusted.
func (z *zone) gap(d, maxGap time.Duration) {
	z.faults++
	z.lastFault = fmt.Sprintf("zone %s: no sample for %s (max gap %s): a counter wrap may be lost", z.label(), d, maxGap)
}
