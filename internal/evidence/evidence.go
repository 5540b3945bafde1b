// Package evidence answers what a host holds as evidence: a run's record
// verified from genesis, its unit and grants, the objects a record
// reaches, a record's wait proof, a whole verification of a run, and the
// host keys trusted to sign what it imports. Nothing here takes a run's
// lock or changes a record: the daemon embeds a Reader and serves these
// reads as its own, and its operations stay in the daemon.
package evidence

import (
	"context"
	"net/http"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/transfer"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Reader reads a host's evidence.
type Reader struct {
	st       *store.Store
	keys     func() trust.Keys
	admitted func(record.Address) bool
	stdout   func(id string) string
}

// New reads st's evidence. keys are the host's trusted keys (as they are
// at each use); admitted, when
// not nil, says whether a key is also trusted as a host admitted to the
// host's fleet (docs/fleet.md); stdout is where a run's unit output goes
// on this host.
func New(st *store.Store, keys func() trust.Keys, admitted func(record.Address) bool, stdout func(id string) string) Reader {
	return Reader{st: st, keys: keys, admitted: admitted, stdout: stdout}
}

// Record is run id's record, verified from genesis.
func (e Reader) Record(id string) (*record.Record, error) { return e.st.Record(id) }

// Unit is run id's unit spec and grant set.
func (e Reader) Unit(id string) (unit.Spec, unit.Grants, error) {
	st, err := e.st.Run(id)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, err
	}
	return e.st.ReadRun(st)
}

// Object is the bytes of an object a record reaches (an attestation, a
// receipt, a journal), rehashed on the way.
func (e Reader) Object(a record.Address) ([]byte, error) { return e.st.ReadAll(a) }

// Objects serves the host's objects by address to the fleet's other
// hosts (internal/transfer; the peer listener admits host keys only).
func (e Reader) Objects() http.Handler { return transfer.Handler(e.st) }

// Stdout is where run id's unit output goes on this host.
func (e Reader) Stdout(id string) string { return e.stdout(id) }

// WaitProof returns a run's wait-proof verdict.
func (e Reader) WaitProof(id string) (record.Verdict, error) {
	rec, err := e.st.Record(id)
	if err != nil {
		return record.Verdict{}, err
	}
	return rec.WaitProof(), nil
}

// Verify verifies a run's record from genesis and rehashes every object it
// reaches ([bundle.Verify]); the image snapshots of a run whose snapshots
// were released are not asked for. A record or object that fails is
// reported in the result (Err), not as a failed request.
func (e Reader) Verify(ctx context.Context, id string) (answers.Verification, error) {
	if _, err := e.st.Run(id); err != nil {
		return answers.Verification{}, err
	}
	v, err := bundle.Verify(ctx, e.st, id, e.Trusted, !e.Released(id))
	out := answers.Verification{Run: id, Objects: v.Objects, Bytes: v.Bytes, Err: err}
	if rec := v.Record; rec != nil {
		out.Segments, out.Phase, out.Head, out.WaitProof = rec.Len(), rec.Phase(), rec.Head(), rec.WaitProof()
		out.Signers = e.Signers(v.Signers)
	}
	return out, nil
}

// Released reports whether run id's image snapshots were released.
func (e Reader) Released(id string) bool {
	r, err := e.st.RetentionOf(id)
	return err == nil && !r.Released.IsZero()
}

// Trusted says whether a host key id is trusted here: trusted on this host
// (internal/trust), or admitted to its fleet as a host.
func (e Reader) Trusted(key record.Address) bool {
	return e.keys().Trusted(key) || (e.admitted != nil && e.admitted(key))
}

// Trust trusts a host key under name: bundles whose attestations it signed
// may be imported.
func (e Reader) Trust(key, name string) (trust.Key, error) { return e.keys().Add(key, name) }

// Untrust stops trusting a host key. Runs already imported stay.
func (e Reader) Untrust(key string) error { return e.keys().Remove(key) }

// TrustedKeys lists the trusted host keys, this host's first.
func (e Reader) TrustedKeys() ([]trust.Key, error) { return e.keys().List() }

// Signers is a record's signers, with their names.
func (e Reader) Signers(ss []attest.Signer) []answers.Signer { return e.keys().Names(ss) }

// Calls lists the outward calls awaiting results in every run the host
// holds, from the call ledger: each with its payload and whether a result
// has been posted (internal/calls).
func (e Reader) Calls(context.Context) ([]calls.Listed, error) { return calls.List(e.st) }
