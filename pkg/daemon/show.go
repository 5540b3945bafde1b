package daemon

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/bundle"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Show returns a run in full: every segment with the evidence behind it,
// the run's energy and its wait proof. The record is verified from genesis
// on the way.
func (d *Daemon) Show(ctx context.Context, id string) (api.Show, error) {
	sum, err := d.Run(id)
	if err != nil {
		return api.Show{}, err
	}
	rec, err := d.st.Record(id)
	if err != nil {
		return api.Show{}, err
	}
	out := api.Show{Run: sum, Segments: make([]api.Segment, 0, rec.Len()), WaitProof: waitProof(rec.WaitProof()),
		Stdout: d.outputOf(id).Stdout}
	if st, err := d.st.Run(id); err == nil {
		if spec, grants, err := d.unitOf(st); err == nil {
			out.Unit, out.Grants = &spec, &grants
		}
	}
	receipts := map[record.Address]attest.Receipt{}
	activeProv := map[record.Provenance]bool{}
	for i := range rec.Len() {
		s := rec.Segment(i)
		seg := api.Segment{Index: i, Kind: s.Kind.String(), Head: rec.HeadAt(i).String()}
		switch s.Kind {
		case record.Executed:
			seg.Attestation = s.Attestation.String()
			if s.Calls != nil {
				seg.Calls = &api.CallAccount{Dispatched: nonNil(s.Calls.Dispatched), Resolved: nonNil(s.Calls.Resolved)}
			}
			body, err := d.attestation(s.Attestation)
			if err != nil {
				return api.Show{}, fmt.Errorf("segment %d: %w", i, err)
			}
			start, end := time.Unix(0, body.StartNS).UTC(), time.Unix(0, body.EndNS).UTC()
			seg.Interval, seg.Start, seg.End = body.Interval, &start, &end
			seg.Outcome = outcomeString(body.Outcome)
			seg.Host = body.HostKey.String()
			if b, err := d.st.ReadAll(body.Receipt); err == nil {
				if rc, err := attest.DecodeReceipt(b); err == nil {
					e := energyOf(*rc)
					seg.Receipt, seg.CPUNS = &e, rc.CPUNS
					receipts[s.Attestation] = *rc
					activeProv[rc.Provenance] = true
				}
			}
			if b, err := d.st.ReadAll(body.Journal); err == nil {
				if j, err := attest.DecodeJournal(b); err == nil {
					seg.Checkpoint = checkpointIn(j)
				}
			}
		case record.Suspended, record.Resumed:
			seg.Snapshot, seg.Form = s.Snapshot.String(), "image"
			if s.Snapshot.IsTranscript() {
				seg.Form = "transcript"
			}
			if s.Kind == record.Suspended {
				seg.Manifest = s.Manifest.String()
			} else {
				seg.Idle = &api.Energy{UJ: s.IdleUJ, Provenance: s.Provenance.String()}
			}
		case record.Closed:
			seg.Reason = s.Reason
		}
		out.Segments = append(out.Segments, seg)
	}
	tot, err := rec.Totals(func(a record.Address) (uint64, bool) {
		rc, ok := receipts[a]
		return rc.UJ, ok
	})
	if err != nil {
		return api.Show{}, err
	}
	out.Totals = api.Totals{ActiveUJ: tot.ActiveUJ, IdleUJ: tot.IdleUJ, CostUJ: tot.CostUJ,
		ActiveProvenance: provenances(activeProv), IdleProvenance: "none"}
	if hasResume(rec) {
		out.Totals.IdleProvenance = "estimated"
		if tot.IdleMeasured {
			out.Totals.IdleProvenance = "measured"
		}
	}
	return out, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func hasResume(rec *record.Record) bool {
	for i := range rec.Len() {
		if rec.Segment(i).Kind == record.Resumed {
			return true
		}
	}
	return false
}

func provenances(m map[record.Provenance]bool) string {
	switch {
	case len(m) == 0:
		return "none"
	case len(m) > 1:
		return "mixed"
	case m[record.Measured]:
		return "measured"
	default:
		return "estimated"
	}
}

func outcomeString(o attest.Outcome) string {
	if o.Kind == attest.Exited {
		return fmt.Sprintf("exited(%d)", o.Code)
	}
	return o.Kind.String()
}

// checkpointIn finds the checkpoint statistics a park journaled.
func checkpointIn(j *attest.Journal) *api.Checkpoint {
	var c attest.Checkpointed
	if !j.Find(&c) {
		return nil
	}
	return apiCheckpoint(c)
}

func waitProof(v record.Verdict) api.WaitProof {
	w := api.WaitProof{Verdict: v.Kind.String(), Reason: v.Reason}
	if v.Segment >= 0 {
		seg := v.Segment
		w.Segment = &seg
	}
	return w
}

// WaitProof returns a run's wait-proof verdict.
func (d *Daemon) WaitProof(id string) (api.WaitProof, error) {
	rec, err := d.st.Record(id)
	if err != nil {
		return api.WaitProof{}, err
	}
	return waitProof(rec.WaitProof()), nil
}

// Verify verifies a run's record from genesis and rehashes every object it
// reaches. A record or object that fails is reported in the result (OK
// false, with the error), not as a failed request.
func (d *Daemon) Verify(ctx context.Context, id string) (api.Verify, error) {
	out := api.Verify{Run: id}
	if _, err := d.st.Run(id); err != nil {
		return out, err
	}
	rec, err := d.st.Record(id)
	if err != nil {
		out.Error = ErrorOf(err)
		return out, nil
	}
	out.Segments, out.Phase, out.Head = rec.Len(), rec.Phase().String(), rec.Head().String()
	out.WaitProof = waitProof(rec.WaitProof())
	// Every attestation: signed, at its place; its signer reported
	// trusted or not (a run imported before a key was removed stays).
	signers, err := attest.CheckRecord(rec, d.st.ReadAll, d.trusted)
	out.Signers = d.signersOf(signers)
	if err != nil {
		out.Error = ErrorOf(err)
		return out, nil
	}
	// A closed run whose image snapshots retention released verifies
	// without them: its record and evidence are all it keeps.
	objs, err := bundle.Reached(d.st, rec, !d.released(id))
	if err != nil {
		out.Error = ErrorOf(err)
		return out, nil
	}
	for _, a := range objs {
		if err := d.st.Verify(ctx, a); err != nil {
			out.Error = ErrorOf(err)
			return out, nil
		}
		n, _ := d.st.Size(a)
		out.Objects++
		out.Bytes += n
	}
	out.OK = true
	return out, nil
}

// Host describes this daemon's host.
func (d *Daemon) Host() api.Host {
	h := api.Host{KeyID: d.keyID.String(), StateDir: d.cfg.StateDir, Embedded: d.ctrd != nil, Manifest: map[string]string{}}
	if d.ctrd != nil {
		h.Containerd = d.ctrd.Address()
	} else {
		h.Containerd = d.cfg.ContainerdAddress
	}
	for k, v := range d.host {
		h.Manifest[k] = v
	}
	snap := d.meter.Snapshot()
	h.RAPL, h.RAPLReason = snap.Available, snap.Reasons
	h.ImageParks = d.imageParksStatus()
	return h
}

// ImportImage imports an OCI or docker image archive.
func (d *Daemon) ImportImage(ctx context.Context, r io.Reader, name string) (api.Image, error) {
	img, err := d.ex.Import(ctx, r, name)
	if err != nil {
		return api.Image{}, err
	}
	return api.Image{Name: img.Name, Digest: img.Digest}, nil
}
