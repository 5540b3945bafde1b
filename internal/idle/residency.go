package idle

import (
	"strconv"
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Residency is the warm-pool residency a parked run owes: the draw of the
// sandboxes made ahead for its next interval (internal/warmpool) while
// they waited, from each one's creation to its use or discard. It is
// retained state, so it goes into the idle_uj of the run's next Resumed
// segment (the spec's "warm-pool residency"), labelled apart in the idle
// entry's inputs (OwedWith). The zero value is none.
type Residency struct {
	UJ    uint64 // the energy, rounded up per sandbox
	NS    uint64 // the time the sandboxes were held, summed
	Bytes uint64 // the largest resident set of one of them
	// Sandboxes is how many were held; Estimated, how many of those
	// were estimated rather than measured.
	Sandboxes, Estimated int
}

// Add adds o to r.
func (r *Residency) Add(o Residency) {
	r.UJ = satAdd(r.UJ, o.UJ)
	r.NS = satAdd(r.NS, o.NS)
	r.Bytes = max(r.Bytes, o.Bytes)
	r.Sandboxes += o.Sandboxes
	r.Estimated += o.Estimated
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

// Resident is one warm sandbox's residency from [Meter.BeginResident] to
// [Resident.End].
type Resident struct{ p *Park }

// BeginResident marks the creation of a warm sandbox.
func (m *Meter) BeginResident() *Resident { return &Resident{p: m.BeginPark()} }

// End is the residency of a sandbox that held bytes resident since
// BeginResident: measured as a park's resident memory is (the RAPL DRAM
// zones' energy × bytes / MemTotal) where the host has DRAM zones,
// estimated from the DRAM coefficient otherwise. Nothing is retained in
// storage: the sandbox's root is the image's, which the run's unit keeps
// anyway. A nil Resident is no residency.
func (r *Resident) End(bytes uint64) Residency {
	if r == nil {
		return Residency{}
	}
	held := time.Since(r.p.begin.at)
	uj, prov, _ := r.p.End(0, bytes)
	out := Residency{UJ: uj, NS: durationNS(held), Bytes: bytes, Sandboxes: 1}
	if prov != record.Measured {
		out.Estimated = 1
	}
	return out
}

// OwedWith is [Owed] with the warm-pool residency w added: the idle
// energy includes it, its provenance is estimated if any of w was, and
// the inputs label it apart — warm_pool_uj, warm_pool_ns,
// warm_pool_resident_bytes, warm_pool_sandboxes and warm_pool (measured
// or estimated) — so that a reader sees which part of idle_uj the pool
// cost. Without residency it is Owed exactly.
func OwedWith(p *Park, retained int64, parkedFor time.Duration, c Coefficients, w Residency) (attest.Idle, record.Provenance) {
	idl, prov := Owed(p, retained, parkedFor, c)
	if w.Sandboxes == 0 {
		return idl, prov
	}
	if idl.Inputs == nil {
		idl.Inputs = map[string]string{}
	}
	wprov := record.Measured
	if w.Estimated > 0 {
		wprov = record.Estimated
		prov = record.Estimated
	}
	idl.UJ = satAdd(idl.UJ, w.UJ)
	idl.Provenance = prov.String()
	idl.Inputs["warm_pool"] = wprov.String()
	idl.Inputs["warm_pool_uj"] = strconv.FormatUint(w.UJ, 10)
	idl.Inputs["warm_pool_ns"] = strconv.FormatUint(w.NS, 10)
	idl.Inputs["warm_pool_resident_bytes"] = strconv.FormatUint(w.Bytes, 10)
	idl.Inputs["warm_pool_sandboxes"] = strconv.Itoa(w.Sandboxes)
	return idl, prov
}
