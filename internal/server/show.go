package server

import (
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// show presents a run in full (GET /v1/runs/{id}): every segment with the
// evidence behind it, the run's energy and its wait proof. The record is
// verified from genesis on the way; the evidence is read through the
// daemon, rehashed.
func show(d Daemon, st Store, id string) (api.Show, error) {
	sum, err := d.Run(id)
	if err != nil {
		return api.Show{}, err
	}
	rec, err := st.Record(id)
	if err != nil {
		return api.Show{}, err
	}
	out := api.Show{Run: runOf(sum), Segments: make([]api.Segment, 0, rec.Len()), WaitProof: waitProofOf(rec.WaitProof()),
		Stdout: d.Stdout(id), Restore: restoreIn(d.OpenJournal(id))}
	if r, err := st.Run(id); err == nil {
		if spec, grants, err := st.ReadRun(r); err == nil {
			out.Unit, out.Grants = &spec, &grants
		}
	}
	receipts := map[record.Address]attest.Receipt{}
	for i := range rec.Len() {
		s := rec.Segment(i)
		seg := api.Segment{Index: i, Kind: s.Kind.String(), Head: rec.HeadAt(i).String()}
		switch s.Kind {
		case record.Executed:
			rc, err := executedSegment(st, &seg, s)
			if err != nil {
				return api.Show{}, fmt.Errorf("segment %d: %w", i, err)
			}
			if rc != nil {
				receipts[s.Attestation] = *rc
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
	out.Totals, err = totalsOf(rec, receipts)
	return out, err
}

// executedSegment fills in an Executed segment from its attestation, and
// its receipt and journal when they read (nil receipt when not): a run
// whose evidence was damaged still shows what is left.
func executedSegment(st Store, seg *api.Segment, s record.Segment) (*attest.Receipt, error) {
	seg.Attestation = s.Attestation.String()
	if s.Calls != nil {
		seg.Calls = &api.CallAccount{Dispatched: nonNil(s.Calls.Dispatched), Resolved: nonNil(s.Calls.Resolved)}
	}
	b, err := st.ReadAll(s.Attestation)
	if err != nil {
		return nil, err
	}
	body, err := attest.Open(b, nil)
	if err != nil {
		return nil, err
	}
	start, end := time.Unix(0, body.StartNS).UTC(), time.Unix(0, body.EndNS).UTC()
	seg.Interval, seg.Start, seg.End = body.Interval, &start, &end
	seg.Outcome = outcomeString(body.Outcome)
	seg.Host = body.HostKey.String()
	if b, err := st.ReadAll(body.Journal); err == nil {
		if j, err := attest.DecodeJournal(b); err == nil {
			var c attest.Checkpointed
			if j.Find(&c) {
				seg.Checkpoint = checkpointOf(&c)
			}
			seg.Restore = restoreIn(j)
		}
	}
	b, err = st.ReadAll(body.Receipt)
	if err != nil {
		return nil, nil
	}
	rc, err := attest.DecodeReceipt(b)
	if err != nil {
		return nil, nil
	}
	e := energyOf(*rc)
	seg.Receipt, seg.CPUNS = &e, rc.CPUNS
	return rc, nil
}

// totalsOf is a run's energy: active from the receipts that read, idle
// from its Resumed segments, and the provenance of each.
func totalsOf(rec *record.Record, receipts map[record.Address]attest.Receipt) (api.Totals, error) {
	tot, err := rec.Totals(func(a record.Address) (uint64, bool) {
		rc, ok := receipts[a]
		return rc.UJ, ok
	})
	if err != nil {
		return api.Totals{}, err
	}
	prov := map[record.Provenance]bool{}
	for _, rc := range receipts {
		prov[rc.Provenance] = true
	}
	out := api.Totals{ActiveUJ: tot.ActiveUJ, IdleUJ: tot.IdleUJ, CostUJ: tot.CostUJ,
		ActiveProvenance: provenances(prov), IdleProvenance: "none"}
	if hasResume(rec) {
		out.IdleProvenance = "estimated"
		if tot.IdleMeasured {
			out.IdleProvenance = "measured"
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
