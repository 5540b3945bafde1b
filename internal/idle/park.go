package idle

import (
	"fmt"
	"math/big"
	"strconv"

	"github.com/runrecordd/runrecordd/pkg/record"
)

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
