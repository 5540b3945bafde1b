package idle

import (
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Owed is the idle energy a park owes at its resume, as the Resumed
// segment and its journal entry record it: metered when p, the park this
// process began, is not nil; estimated from c otherwise. A park always
// retains something (its record, its manifest), so its idle energy is
// never zero, and the record refuses a zero: it is floored at 1 µJ, and
// the inputs say so.
func Owed(p *Park, retained int64, parkedFor time.Duration, c Coefficients) (attest.Idle, record.Provenance) {
	var (
		uj     uint64
		prov   record.Provenance
		inputs map[string]string
	)
	if p != nil {
		uj, prov, inputs = p.End(uint64(retained), 0)
	} else {
		uj, prov, inputs = Estimate(uint64(retained), 0, parkedFor, c)
	}
	if uj == 0 {
		if inputs == nil {
			inputs = map[string]string{}
		}
		uj = 1
		inputs["floor"] = "1"
	}
	return attest.Idle{UJ: uj, Provenance: prov.String(), Inputs: inputs, RetainedBytes: retained, ParkedNS: int64(parkedFor)}, prov
}
