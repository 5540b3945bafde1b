package bundle

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Verified is a stored run checked as an import checks a bundle.
type Verified struct {
	Record  *record.Record // nil when the record does not verify from genesis
	Signers []attest.Signer
	Objects int   // objects reached and rehashed
	Bytes   int64 // their bytes
}

// Verify checks stored run id from genesis, as an import checks a bundle:
// its record verifies, every attestation is signed and at its place (its
// signer reported trusted or not: a run imported before a key was removed
// stays), and every object the record reaches rehashes to its address —
// without image snapshots when images is false (a closed run whose
// snapshots retention released keeps only its record and evidence). A run
// that fails is reported in err, with what was learnt before it.
func Verify(ctx context.Context, st *store.Store, id string, trusted func(record.Address) bool, images bool) (Verified, error) {
	var out Verified
	rec, err := st.Record(id)
	if err != nil {
		return out, err
	}
	out.Record = rec
	out.Signers, err = attest.CheckRecord(rec, st.ReadAll, trusted)
	if err != nil {
		return out, err
	}
	objs, err := Reached(st, rec, images)
	if err != nil {
		return out, err
	}
	for _, a := range objs {
		if err := st.Verify(ctx, a); err != nil {
			return out, err
		}
		n, _ := st.Size(a)
		out.Objects++
		out.Bytes += n
	}
	return out, nil
}
