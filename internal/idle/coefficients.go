package idle

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Default coefficients. docs/energy.md gives their sources and the unit
// conversions.
const (
	// DefaultCPUWatts is the draw of one busy logical CPU (hardware thread):
	// Cloud Carbon Footprint's AWS per-vCPU figures (0.74 W idle, 3.5 W at
	// full load) at the 50% utilisation they assume, divided by that
	// utilisation so that idle power is spread over busy time the way the
	// measured method spreads it: 0.74/0.5 + (3.5 − 0.74) = 4.24 W.
	DefaultCPUWatts = 4.24
	// SSDWattsPerTB is the draw of SSD storage per terabyte (10¹² bytes)
	// held: 1.2 Wh per TB-hour (6 W per 5 TB disk). The default.
	SSDWattsPerTB = 1.2
	// HDDWattsPerTB is the same for hard disks: 0.65 Wh per TB-hour (6.5 W
	// per 10 TB disk). Configure it for a state directory on disks.
	HDDWattsPerTB = 0.65
	// DefaultDRAMWattsPerGB is the draw of resident DRAM per gigabyte
	// (10⁹ bytes): 0.392 W, the mean of Crucial's 3 W per 8 GB and Micron's
	// DDR4 power model.
	DefaultDRAMWattsPerGB = 0.392
)

// Coefficients are the figures estimation multiplies by. They are
// configuration: [DefaultCoefficients] holds sourced defaults and
// [ParseCoefficients] reads JSON over them. Every figure must be finite
// and positive.
type Coefficients struct {
	// CPUWatts is watts per busy logical CPU: an estimated receipt is the
	// sandbox's CPU time × CPUWatts.
	CPUWatts float64 `json:"cpu_watts"`
	// StorageWattsPerTB is watts per 10¹² bytes retained by a park.
	StorageWattsPerTB float64 `json:"storage_watts_per_tb"`
	// DRAMWattsPerGB is watts per 10⁹ bytes a park leaves resident.
	DRAMWattsPerGB float64 `json:"dram_watts_per_gb"`
}

// DefaultCoefficients returns the defaults: [DefaultCPUWatts],
// [SSDWattsPerTB] and [DefaultDRAMWattsPerGB].
func DefaultCoefficients() Coefficients {
	return Coefficients{
		CPUWatts:          DefaultCPUWatts,
		StorageWattsPerTB: SSDWattsPerTB,
		DRAMWattsPerGB:    DefaultDRAMWattsPerGB,
	}
}

// ParseCoefficients reads a JSON object over the defaults: a field left
// out keeps its default, an unknown field is an error, and the result must
// pass [Coefficients.Validate].
func ParseCoefficients(data []byte) (Coefficients, error) {
	c := DefaultCoefficients()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Coefficients{}, fmt.Errorf("%w: %w", ErrCoefficients, err)
	}
	if dec.More() {
		return Coefficients{}, fmt.Errorf("%w: trailing data after the object", ErrCoefficients)
	}
	if err := c.Validate(); err != nil {
		return Coefficients{}, err
	}
	return c, nil
}

// Validate reports, with [ErrCoefficients], a figure that is not finite
// and positive.
func (c Coefficients) Validate() error {
	for _, f := range c.fields() {
		if !validFigure(*f.v) {
			return fmt.Errorf("%w: %s is %v, must be finite and positive", ErrCoefficients, f.name, *f.v)
		}
	}
	return nil
}

type coefficientField struct {
	name string
	v    *float64
	def  float64
}

func (c *Coefficients) fields() []coefficientField {
	return []coefficientField{
		{"cpu_watts", &c.CPUWatts, DefaultCPUWatts},
		{"storage_watts_per_tb", &c.StorageWattsPerTB, SSDWattsPerTB},
		{"dram_watts_per_gb", &c.DRAMWattsPerGB, DefaultDRAMWattsPerGB},
	}
}

func validFigure(f float64) bool { return f > 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }

// sane returns c with every invalid figure replaced by its default, and
// the names of those replaced. The zero Coefficients is thus the defaults.
func (c Coefficients) sane() (Coefficients, []string) {
	var replaced []string
	for _, f := range c.fields() {
		if !validFigure(*f.v) {
			*f.v = f.def
			replaced = append(replaced, f.name)
		}
	}
	return c, replaced
}

// figure returns f as the exact rational of its shortest decimal form, so
// 1.2 is 12/10 and not the binary double nearest it.
func figure(f float64) *big.Rat {
	r, ok := new(big.Rat).SetString(formatFigure(f))
	if !ok { // unreachable for a finite float
		r = new(big.Rat).SetFloat64(f)
	}
	return r
}

func formatFigure(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// Powers of ten, as rationals.
var (
	ratE3  = new(big.Rat).SetInt64(1e3)
	ratE12 = new(big.Rat).SetInt64(1e12)
	ratE15 = new(big.Rat).SetInt64(1e15)
)

// storageUJ is bytes × ns × W/TB exactly, in µJ:
// bytes/10¹² TB × ns/10⁹ s × W × 10⁶ µJ/J = bytes·ns·W / 10¹⁵.
func storageUJ(bytes uint64, ns uint64, wattsPerTB float64) *big.Rat {
	r := new(big.Rat).SetInt(new(big.Int).Mul(new(big.Int).SetUint64(bytes), new(big.Int).SetUint64(ns)))
	r.Mul(r, figure(wattsPerTB))
	return r.Quo(r, ratE15)
}

// dramUJ is bytes × ns × W/GB exactly, in µJ:
// bytes/10⁹ GB × ns/10⁹ s × W × 10⁶ µJ/J = bytes·ns·W / 10¹².
func dramUJ(bytes uint64, ns uint64, wattsPerGB float64) *big.Rat {
	r := new(big.Rat).SetInt(new(big.Int).Mul(new(big.Int).SetUint64(bytes), new(big.Int).SetUint64(ns)))
	r.Mul(r, figure(wattsPerGB))
	return r.Quo(r, ratE12)
}

// cpuUJ is ns × W exactly, in µJ: ns/10⁹ s × W × 10⁶ µJ/J = ns·W / 10³.
func cpuUJ(ns uint64, watts float64) *big.Rat {
	r := new(big.Rat).SetUint64(ns)
	r.Mul(r, figure(watts))
	return r.Quo(r, ratE3)
}

// ceilUJ rounds a non-negative exact figure up to whole microjoules,
// saturating at the largest uint64. saturated reports the saturation.
func ceilUJ(r *big.Rat) (uj uint64, saturated bool) {
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsUint64() {
		return math.MaxUint64, true
	}
	return q.Uint64(), false
}

// durationNS returns d in nanoseconds, a negative d as zero.
func durationNS(d time.Duration) uint64 {
	if d < 0 {
		return 0
	}
	return uint64(d)
}

// Estimate returns the idle energy of a park that retained retainedBytes
// in storage and left residentBytes resident in memory for parked:
//
//	uj = ⌈retained × StorageWattsPerTB/10¹² × parked  +  resident × DRAMWattsPerGB/10⁹ × parked⌉
//
// computed exactly (math/big, the coefficients taken at their shortest
// decimal form) and rounded up once. A park that kept anything for any
// time is never zero: the result is at least 1 µJ. The provenance is
// always [record.Estimated]. Invalid figures in c (the zero Coefficients,
// say) are replaced by their defaults, and the inputs name them under
// "coefficients_replaced". The inputs are those of docs/energy.md.
func Estimate(retainedBytes, residentBytes uint64, parked time.Duration, c Coefficients) (uint64, record.Provenance, map[string]string) {
	c, replaced := c.sane()
	ns := durationNS(parked)
	in := map[string]string{
		"method":         MethodIdleCoefficient,
		"retained_bytes": strconv.FormatUint(retainedBytes, 10),
		"resident_bytes": strconv.FormatUint(residentBytes, 10),
		"parked_ns":      strconv.FormatUint(ns, 10),
	}
	if len(replaced) > 0 {
		in["coefficients_replaced"] = strings.Join(replaced, ",")
	}
	total := new(big.Rat)
	if retainedBytes > 0 {
		in["storage_watts_per_tb"] = formatFigure(c.StorageWattsPerTB)
		total.Add(total, storageUJ(retainedBytes, ns, c.StorageWattsPerTB))
	}
	if residentBytes > 0 {
		in["dram_watts_per_gb"] = formatFigure(c.DRAMWattsPerGB)
		in["dram"] = record.Estimated.String()
		total.Add(total, dramUJ(residentBytes, ns, c.DRAMWattsPerGB))
	}
	uj := finishIdle(total, retainedBytes, residentBytes, ns, in)
	return uj, record.Estimated, in
}

// finishIdle rounds an idle figure up, applies the floor of 1 µJ for a
// park that kept anything for any time, and notes saturation and the floor
// in the inputs.
func finishIdle(total *big.Rat, retained, resident, ns uint64, in map[string]string) uint64 {
	uj, saturated := ceilUJ(total)
	if saturated {
		in["saturated"] = "true"
	}
	if uj == 0 && (retained > 0 || resident > 0) && ns > 0 {
		uj = 1
		in["floor"] = "1"
	}
	return uj
}
