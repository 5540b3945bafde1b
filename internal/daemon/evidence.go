package daemon

import (
	"context"
	"io"
	"net/http"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/transfer"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Record is run id's record, verified from genesis.
func (d *Daemon) Record(id string) (*record.Record, error) { return d.st.Record(id) }

// Unit is run id's unit spec and grant set.
func (d *Daemon) Unit(id string) (unit.Spec, unit.Grants, error) {
	st, err := d.st.Run(id)
	if err != nil {
		return unit.Spec{}, unit.Grants{}, err
	}
	r, err := forms.ReadRun(d.st, st)
	return r.Spec, r.Grants, err
}

// Object is the bytes of an object a record reaches (an attestation, a
// receipt, a journal), rehashed on the way.
func (d *Daemon) Object(a record.Address) ([]byte, error) { return d.st.ReadAll(a) }

// Objects serves this host's objects by address to the fleet's other
// hosts (internal/transfer; the peer listener admits host keys only).
func (d *Daemon) Objects() http.Handler { return transfer.Handler(d.st) }

// Stdout is where run id's unit output goes on this host.
func (d *Daemon) Stdout(id string) string { return d.outputOf(id).Stdout }

// WaitProof returns a run's wait-proof verdict.
func (d *Daemon) WaitProof(id string) (record.Verdict, error) {
	rec, err := d.st.Record(id)
	if err != nil {
		return record.Verdict{}, err
	}
	return rec.WaitProof(), nil
}

// Verify verifies a run's record from genesis and rehashes every object it
// reaches ([bundle.Verify]). A record or object that fails is reported in
// the result (Err), not as a failed request.
func (d *Daemon) Verify(ctx context.Context, id string) (Verification, error) {
	if _, err := d.st.Run(id); err != nil {
		return Verification{}, err
	}
	v, err := bundle.Verify(ctx, d.st, id, d.trusted, !d.released(id))
	out := Verification{Run: id, Objects: v.Objects, Bytes: v.Bytes, Err: err}
	if rec := v.Record; rec != nil {
		out.Segments, out.Phase, out.Head, out.WaitProof = rec.Len(), rec.Phase(), rec.Head(), rec.WaitProof()
		out.Signers = d.signersOf(v.Signers)
	}
	return out, nil
}

// Host describes this daemon's host.
func (d *Daemon) Host() HostInfo {
	h := HostInfo{KeyID: d.keyID, StateDir: d.cfg.StateDir, Embedded: d.ctrd != nil, Containerd: d.cfg.ContainerdAddress,
		Manifest: manifest.Manifest{}, Meter: d.meter.Snapshot(), ImageParks: d.probe.Status()}
	if d.ctrd != nil {
		h.Containerd = d.ctrd.Address()
	}
	for k, v := range d.host {
		h.Manifest[k] = v
	}
	return h
}

// ImportImage imports an OCI or docker image archive.
func (d *Daemon) ImportImage(ctx context.Context, r io.Reader, name string) (executor.Image, error) {
	return d.ex.Import(ctx, r, name)
}
