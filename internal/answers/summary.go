package answers

import (
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Summarize is run id as this host holds it; executing says whether its
// unit has a sandbox here, opened when that sandbox's interval began (zero
// when unknown). A unit spec that cannot be read leaves Spec
// nil (so does a grant set that cannot be).
func Summarize(st *store.Store, id string, executing bool, opened time.Time) (Summary, error) {
	r, err := st.Run(id)
	if err != nil {
		return Summary{}, err
	}
	out := Summary{ID: id, Phase: r.Phase, Segments: r.Len, Head: r.Head, Unit: r.Unit, Grants: r.Grants}
	if spec, _, err := st.ReadRun(r); err == nil {
		out.Spec = &spec
	}
	held, off, err := st.HandedOff(id)
	out.HandedOff = err == nil && off
	if ret, err := st.RetentionOf(id); err == nil {
		out.Pinned, out.Released = ret.Pinned, !ret.Released.IsZero()
	}
	out.Status = statusOf(r, out.HandedOff, held.Copy, executing)
	out.Started, out.ParkedAt = timesOf(st, id, r.Phase)
	if out.Started.IsZero() && executing && !opened.IsZero() && r.Phase == record.PhaseExecuting {
		out.Started = opened
	}
	return out, nil
}

// timesOf is when a run started and, while it is parked, when it was
// parked, as its record says: the start of its first Executed segment's
// interval, and the end of its last one's. Either is zero when the record
// does not say (no Executed segment yet, or a record or attestation that
// does not read: the summary still lists the run).
func timesOf(st *store.Store, id string, phase record.Phase) (started, parked time.Time) {
	rec, err := st.Record(id)
	if err != nil {
		return
	}
	interval := func(s record.Segment) *attest.Body {
		b, err := st.ReadAll(s.Attestation)
		if err != nil {
			return nil
		}
		body, err := attest.Open(b, nil)
		if err != nil {
			return nil
		}
		return body
	}
	for i := range rec.Len() {
		if s := rec.Segment(i); s.Kind == record.Executed {
			if b := interval(s); b != nil {
				started = time.Unix(0, b.StartNS).UTC()
			}
			break
		}
	}
	if phase != record.PhaseParked {
		return
	}
	for i := rec.Len() - 1; i >= 0; i-- {
		if s := rec.Segment(i); s.Kind == record.Executed {
			if b := interval(s); b != nil {
				parked = time.Unix(0, b.EndNS).UTC()
			}
			break
		}
	}
	return
}

// statusOf is a run's status: closed, handed off (or a copy), parked in
// its form, running here, or lost.
func statusOf(r store.Run, handedOff, isCopy, executing bool) Status {
	switch {
	case r.Phase == record.PhaseClosed:
		return Closed
	case handedOff && isCopy:
		return Copy
	case handedOff:
		return HandedOff
	case r.Phase == record.PhaseParked && r.Parked.IsTranscript():
		return ParkedTranscript
	case r.Phase == record.PhaseParked:
		return ParkedImage
	case executing:
		return Running
	}
	return Lost
}
