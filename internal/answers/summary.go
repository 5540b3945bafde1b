package answers

import (
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Summarize is run id as this host holds it; executing says whether its
// unit has a sandbox here. A unit spec that cannot be read leaves Spec
// nil (so does a grant set that cannot be).
func Summarize(st *store.Store, id string, executing bool) (Summary, error) {
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
	return out, nil
}

// statusOf is a run's status: closed, handed off (or a copy), parked in
// its form, running here, or lost.
func statusOf(r store.Run, handedOff, isCopy, executing bool) Status {
	switch {
	case r.Phase == record.Ended:
		return Closed
	case handedOff && isCopy:
		return Copy
	case handedOff:
		return HandedOff
	case r.Phase == record.Parked && r.Parked.IsTranscript():
		return ParkedTranscript
	case r.Phase == record.Parked:
		return ParkedImage
	case executing:
		return Running
	}
	return Lost
}
