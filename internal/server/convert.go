package server

import (
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/retention"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The daemon's domain results as the API's wire types (pkg/api): the one
// place a daemon value meets a JSON tag.

func runOf(s answers.Summary) api.Run {
	out := api.Run{ID: s.ID, Phase: s.Phase.String(), Status: s.Status.String(), Segments: s.Segments,
		Head: s.Head.String(), Unit: s.Unit.String(), Grants: s.Grants.String(),
		HandedOff: s.HandedOff, Pinned: s.Pinned, Released: s.Released}
	if s.Spec != nil {
		out.Image, out.Mode = s.Spec.Image, s.Spec.Mode.String()
	}
	out.Started, out.ParkedAt = timeOf(s.Started), timeOf(s.ParkedAt)
	return out
}

// timeOf is t on the wire: absent when zero.
func timeOf(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

func runsOf(ss []answers.Summary) []api.Run {
	out := make([]api.Run, len(ss))
	for i, s := range ss {
		out[i] = runOf(s)
	}
	return out
}

func stepsOf(ss []answers.Step) []api.Step {
	if ss == nil {
		return nil
	}
	out := make([]api.Step, len(ss))
	for i, s := range ss {
		out[i] = api.Step{Name: s.Name, NS: int64(s.Took)}
	}
	return out
}

func parkOf(p answers.Parked) api.Park {
	return api.Park{Run: runOf(p.Run), Snapshot: p.Snapshot.String(), Manifest: p.Manifest.String(), Retained: p.Retained,
		Receipt: energyOf(p.Receipt), Checkpoint: checkpointOf(p.Checkpoint), DurationNS: int64(p.Took), Steps: stepsOf(p.Steps)}
}

func resumeOf(r answers.Resumed) api.Resume {
	return api.Resume{Run: runOf(r.Run),
		Idle:     api.Energy{UJ: r.Idle.UJ, Provenance: r.Idle.Provenance, Method: "idle-draw", Inputs: r.Idle.Inputs},
		ParkedNS: r.Idle.ParkedNS, Restore: restoreOf(r.Restore), DurationNS: int64(r.Took), Steps: stepsOf(r.Steps)}
}

func energyOf(rc attest.Receipt) api.Energy {
	return api.Energy{UJ: rc.UJ, Provenance: rc.Provenance.String(), Method: rc.Method, Inputs: rc.Inputs}
}

func checkpointOf(c *attest.Checkpointed) *api.Checkpoint {
	if c == nil {
		return nil
	}
	return &api.Checkpoint{TotalNS: c.TotalNS, PauseNS: c.PauseNS, DumpNS: c.DumpNS, DiffNS: c.DiffNS,
		FreezingNS: c.FreezingNS, FrozenNS: c.FrozenNS, MemDumpNS: c.MemDumpNS, MemWriteNS: c.MemWriteNS,
		Pages: c.Pages, PagesScan: c.PagesScan, ImageBytes: c.ImageBytes, RootBytes: c.RootBytes, IngestNS: c.IngestNS}
}

func restoreOf(r *attest.Restored) *api.Restore {
	if r == nil {
		return nil
	}
	return &api.Restore{TotalNS: r.TotalNS, MaterializeNS: r.MaterializeNS, RootfsNS: r.RootfsNS, TaskNS: r.TaskNS,
		ForkingNS: r.ForkingNS, RestoreNS: r.RestoreNS, Pages: r.Pages, Lazy: r.Lazy, Served: r.Served}
}

// restoreIn is the restore a journal's interval began with: its restored
// entry, with a lazy restore's resident or pages-lost entry when there is
// one; nil without a restored entry.
func restoreIn(j *attest.Journal) *api.Restore {
	var r attest.Restored
	if j == nil || !j.Find(&r) {
		return nil
	}
	out := restoreOf(&r)
	var res attest.Resident
	var lost attest.PagesLost
	if j.Find(&res) {
		out.ResidentNS = res.NS
	}
	if j.Find(&lost) {
		out.PagesLost = lost.Reason
	}
	return out
}

func signersOf(ss []answers.Signer) []api.Signer {
	out := make([]api.Signer, 0, len(ss))
	for _, s := range ss {
		out = append(out, api.Signer{Segment: s.Index, Interval: s.Interval, Key: s.Key.String(), Name: s.Name, Trusted: s.Trusted})
	}
	return out
}

func importOf(im answers.Imported) api.Import {
	out := api.Import{Run: runOf(im.Run), Objects: im.Objects, Bytes: im.Bytes, Grants: im.Grants, Signers: signersOf(im.Signers)}
	if im.Unclaimed != nil {
		out.Unclaimed = ErrorOf(im.Unclaimed)
	}
	return out
}

func postedOf(p answers.Posted) api.PostResult {
	out := api.PostResult{Run: p.Run, Call: p.Call, Awaiting: p.Awaiting}
	if p.Resumed != nil {
		r := resumeOf(*p.Resumed)
		out.Resumed = &r
	}
	if p.ResumeErr != nil {
		out.ResumeError = ErrorOf(p.ResumeErr)
	}
	return out
}

func waitProofOf(v record.Verdict) api.WaitProof {
	w := api.WaitProof{Verdict: v.Kind.String(), Reason: v.Reason}
	if v.Segment >= 0 {
		seg := v.Segment
		w.Segment = &seg
	}
	return w
}

func verifyOf(v answers.Verification) api.Verify {
	out := api.Verify{Run: v.Run, OK: v.Err == nil, Objects: v.Objects, Bytes: v.Bytes, Owed: v.Owed}
	if v.Segments > 0 || v.Err == nil {
		out.Segments, out.Phase, out.Head = v.Segments, v.Phase.String(), v.Head.String()
		out.WaitProof, out.Signers = waitProofOf(v.WaitProof), signersOf(v.Signers)
	}
	if v.Owing != nil {
		o := postCopyOwingOf(*v.Owing)
		out.Owing = &o
	}
	if v.Err != nil {
		out.Error = ErrorOf(v.Err)
	}
	return out
}

func callsOf(ls []calls.Listed) []api.Call {
	out := make([]api.Call, len(ls))
	for i, l := range ls {
		out[i] = api.Call{Run: l.Run, Phase: l.Phase.String(), ID: l.ID, Kind: l.Kind, Payload: l.Payload, ResultPosted: l.ResultPosted}
	}
	return out
}

func drainOf(rs []drain.Outcome) api.Drain {
	out := api.Drain{Runs: make([]api.Drained, 0, len(rs))}
	for _, r := range rs {
		d := api.Drained{Run: r.Run, TookNS: int64(r.Took)}
		if r.Err != nil {
			d.Error = ErrorOf(r.Err)
			out.Left++
		} else {
			d.To = r.To.String()
			out.Moved++
		}
		out.Runs = append(out.Runs, d)
	}
	return out
}

func eventOf(e events.Event) api.Event {
	return api.Event{Time: e.Time, Kind: e.Kind, Run: e.Run, Call: e.Call, CallKind: e.CallKind, Detail: e.Detail}
}

func hostOf(h answers.HostInfo) api.Host {
	out := api.Host{KeyID: h.KeyID.String(), StateDir: h.StateDir, Containerd: h.Containerd, Embedded: h.Embedded,
		Manifest: map[string]string{}, RAPL: h.Meter.Available, RAPLReason: h.Meter.Reasons,
		ImageParks: api.ImageParks{Status: h.ImageParks.State.String(), Reason: h.ImageParks.Reason, Notes: h.ImageParks.Notes,
			ProbeNS: int64(h.ImageParks.Took), UserNamespaces: h.ImageParks.UserNS}, UserNamespaces: h.UserNS, HostRootImages: h.HostRootImages,
		CRIU: criuOf(h.CRIU, h.Manifest[manifest.CRIUVersion], h.CRIUOff)}
	for k, v := range h.Manifest {
		out.Manifest[k] = v
	}
	for _, x := range h.Holds {
		out.PostCopyHolds = append(out.PostCopyHolds, api.PostCopyHold{Run: x.Run, Target: x.Target.String(), Head: x.Head.String(), Since: x.Since, Ends: x.Ends})
	}
	for _, x := range h.Owings {
		out.PostCopyOwings = append(out.PostCopyOwings, postCopyOwingOf(x))
	}
	return out
}

// postCopyOwingOf is x as the API shows it: Tried only after a failed
// try.
func postCopyOwingOf(x answers.Owing) api.PostCopyOwing {
	o := api.PostCopyOwing{Run: x.Run, Source: x.Source.String(), Head: x.Head.String(), Slabs: x.Slabs, State: x.State, Reason: x.Reason}
	if !x.Tried.IsZero() {
		o.Tried = &x.Tried
	}
	return o
}

// criuOf is the CRIU build as GET /v1/host shows it; version is the one
// `criu --version` told.
func criuOf(b criu.Build, version string, off []string) api.CRIUBuild {
	out := api.CRIUBuild{Binary: b.Binary, Version: version, Known: b.Record != nil, Unknown: b.Unknown,
		Patches: []api.CRIUFile{}, Capabilities: []string{}, Off: off}
	if m := b.Record; m != nil {
		out.Source = &api.CRIUFile{Name: m.Source.Name, SHA256: m.Source.SHA256}
		for _, p := range m.Patches {
			out.Patches = append(out.Patches, api.CRIUFile{Name: p.Name, SHA256: p.SHA256})
		}
	} else {
		for _, p := range b.Patches() {
			out.Patches = append(out.Patches, api.CRIUFile{Name: p})
		}
	}
	for _, c := range b.Capabilities() {
		out.Capabilities = append(out.Capabilities, string(c))
	}
	return out
}

func gcOf(r retention.Result) api.GC {
	return api.GC{Released: r.Released, Removed: r.Removed, RemovedBytes: r.RemovedBytes, Kept: r.Kept, KeptBytes: r.KeptBytes}
}

func keyOf(k trust.Key) api.TrustedKey {
	return api.TrustedKey{Key: k.Key.String(), Name: k.Name, Self: k.Self}
}

func keysOf(ks []trust.Key) []api.TrustedKey {
	out := make([]api.TrustedKey, 0, len(ks))
	for _, k := range ks {
		out = append(out, keyOf(k))
	}
	return out
}
