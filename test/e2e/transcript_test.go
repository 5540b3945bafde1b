//go:build linux

package e2e

// Transcript parks and non-blocking outward calls (docs/unit-protocol.md),
// end to end: units/agent, which awaits every call it dispatches and so
// parks by its transcript, and units/poller, which polls for its own
// result inside the interval.
//
//   - TestTranscriptAgentThreeCycles: three dispatch/await cycles, results
//     posted after delays; each post of the awaited result resumes the run.
//     The accounts are exactly what the agent did, the wait proof is
//     NonBlocking, the transcript is whole, nothing stays resident and no
//     CPU time accrues while the run waits, and every resume carries
//     estimated idle energy.
//   - TestTranscriptPollerBlocked: the poller's record is Blocked at
//     segment 0, and `runrecordd wait-proof` says so, naming the call.
//   - TestTranscriptRefusals: a result for an unknown call, a second result
//     for a call, a result for a call already resolved and a result for a
//     closed run are each refused with their code, and none of them
//     changes the record or its wait proof.
//   - TestTranscriptOnSecondHost: a parked agent's bundle carries no image
//     data; a fresh daemon imports it, resumes it on a posted result and
//     the run finishes there, one record across both hosts.
//   - TestTranscriptBundleFromBusyHost: the same move from a host whose
//     audit chain holds other runs' attestations.
//   - TestTranscriptResultBeforePark: a result posted as the agent awaits
//     it, before the daemon has parked the run, still reaches the agent.
//   - TestTranscriptWatch: the event stream of an agent run, in order.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/ociarchive"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

const (
	trAgentImage  = "runrecordd.test/agent:1"
	trPollerImage = "runrecordd.test/poller:1"
	// trVariantEnv is set in the agent variant's image config: the same
	// program under another digest.
	trVariantEnv = "RUNRECORDD_TEST_VARIANT=1"
)

var (
	// The transcript units' OCI archives, built by TestMain (build).
	trAgentArchive, trAgentVariantArchive, trPollerArchive string
	trAgentDigest, trAgentVariantDigest, trPollerDigest    string

	// trSharedReady: the shared daemon has the agent's and the poller's
	// images.
	trSharedReady bool
)

// trBuildUnits builds units/agent and units/poller into OCI archives in
// dir, and the agent once more in an image with one more environment
// entry (another digest).
func trBuildUnits(ctx context.Context, dir string) error {
	bins, err := goBinaries(ctx, "./units/agent", "./units/poller", "./units/hostile")
	if err != nil {
		return err
	}
	agent, poller, hostile := bins[0], bins[1], bins[2]
	variant := ociarchive.Unit(trAgentImage, agent)
	variant.Env = append(variant.Env, trVariantEnv)
	for _, u := range []struct {
		img     ociarchive.Image
		file    string
		archive *string
		digest  *string
	}{
		{ociarchive.Unit(trAgentImage, agent), "agent.tar", &trAgentArchive, &trAgentDigest},
		{variant, "agent-variant.tar", &trAgentVariantArchive, &trAgentVariantDigest},
		{ociarchive.Unit(trPollerImage, poller), "poller.tar", &trPollerArchive, &trPollerDigest},
		{ociarchive.Unit(hostileImage, hostile), "hostile.tar", &hostileArchive, &hostileDigest},
	} {
		*u.archive = filepath.Join(dir, u.file)
		d, err := ociarchive.WriteFile(*u.archive, u.img)
		if err != nil {
			return err
		}
		*u.digest = d.Manifest.String()
	}
	if trAgentVariantDigest == trAgentDigest {
		return fmt.Errorf("the agent variant has the agent's digest %s", trAgentDigest)
	}
	return nil
}

// trShared is the shared daemon, with the agent's and the poller's images.
func trShared(t *testing.T) *daemon {
	t.Helper()
	d := shared(t)
	if !trSharedReady {
		mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
		mustImportImage(t, d, trPollerArchive, trPollerImage, trPollerDigest)
		trSharedReady = true
	}
	return d
}

// trStart starts a transcript-mode run of image on d. Its cleanup verifies
// the run from genesis, closes it if it is open and verifies it again.
func trStart(t *testing.T, d *daemon, id, image string, env ...string) {
	t.Helper()
	ctx := context.Background()
	r, err := d.c.Start(ctx, api.RunRequest{ID: id,
		Unit:   unit.Spec{Image: image, Env: env, Mode: unit.TranscriptMode},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 128 << 20, Network: unit.NoNetwork}})
	if err != nil {
		t.Fatalf("start %s on the %s daemon: %v", id, d.name, err)
	}
	closeAtEnd(t, d, id)
	if r.ID != id || r.Phase != "executing" || r.Status != "running" || r.Segments != 0 || r.Mode != "transcript" {
		t.Fatalf("started %+v", r)
	}
}

// trWait waits until run id's summary satisfies ok, and returns it.
func trWait(t *testing.T, d *daemon, id, what string, ok func(api.Run) bool) api.Run {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := d.run(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(d.stdout(id))
			errs, _ := os.ReadFile(filepath.Join(filepath.Dir(d.stdout(id)), "stderr"))
			t.Fatalf("waiting for %s %s on the %s daemon: it is %+v\nunit stdout:\n%s\nunit stderr:\n%s", id, what, d.name, r, out, errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// trParked waits until run id is parked by its transcript with segments
// segments.
func trParked(t *testing.T, d *daemon, id string, segments int) api.Run {
	t.Helper()
	r := trWait(t, d, id, fmt.Sprintf("parked with %d segments", segments), func(r api.Run) bool {
		return r.Phase == "parked" && r.Segments >= segments || r.Phase == "closed"
	})
	if r.Phase != "parked" || r.Status != "parked (transcript)" || r.Segments != segments {
		t.Fatalf("run %s: %+v, want parked (transcript) with %d segments", id, r, segments)
	}
	return r
}

// trClosed waits until run id is closed.
func trClosed(t *testing.T, d *daemon, id string) api.Run {
	t.Helper()
	return trWait(t, d, id, "closed", func(r api.Run) bool { return r.Phase == "closed" })
}

// trCalls lists run id's outstanding calls, each payload compacted (the
// API's reply is indented, payloads with it).
func trCalls(t *testing.T, d *daemon, id string) trCallList {
	t.Helper()
	cs, err := d.c.Calls(context.Background())
	if err != nil {
		t.Fatalf("calls: %v", err)
	}
	var out trCallList
	for _, c := range cs {
		if c.Run != id {
			continue
		}
		var b bytes.Buffer
		if err := json.Compact(&b, c.Payload); err != nil {
			t.Fatalf("call %s of %s: payload %q: %v", c.ID, id, c.Payload, err)
		}
		c.Payload = b.Bytes()
		out = append(out, c)
	}
	return out
}

// trCallList is calls as the messages print them.
type trCallList []api.Call

func (cs trCallList) String() string {
	b, _ := json.Marshal([]api.Call(cs))
	return string(b)
}

// trPost posts call's result and checks that it resumed the run.
func trPost(t *testing.T, d *daemon, id, call, payload string) api.PostResult {
	t.Helper()
	pr, err := d.c.PostResult(context.Background(), id, call, []byte(payload))
	if err != nil {
		t.Fatalf("post %s's %s on the %s daemon: %v", id, call, d.name, err)
	}
	if pr.Run != id || pr.Call != call || len(pr.Awaiting) != 0 || pr.ResumeError != nil || pr.Resumed == nil {
		t.Fatalf("post %s's %s: %+v (resume error %+v), want it resumed", id, call, pr, pr.ResumeError)
	}
	r := pr.Resumed
	if r.Run.Phase != "executing" || r.Run.Status != "running" || r.Restore != nil || r.ParkedNS <= 0 ||
		r.Idle.UJ == 0 || r.Idle.Provenance != "estimated" {
		t.Fatalf("post %s's %s resumed %+v", id, call, r)
	}
	return pr
}

// trResult is the result the tests post for call-n.
func trResult(n int) string { return fmt.Sprintf(`{"call":"call-%d","artifact":"sha256:%d"}`, n, n) }

// trAgentTranscript is the agent's transcript after steps steps, with
// trResult's results.
func trAgentTranscript(steps int) string {
	var b strings.Builder
	for i := 1; i <= steps; i++ {
		fmt.Fprintf(&b, "step %d: thinking\nstep %d: dispatched call-%d\nstep %d: result %s\n", i, i, i, i, trResult(i))
	}
	b.WriteString("done\n")
	return b.String()
}

// trCPU is the CPU time of a run's receipts, and the number of its
// Executed segments.
func trCPU(s api.Show) (ns uint64, n int) {
	for _, seg := range s.Segments {
		if seg.Kind == "executed" {
			ns += seg.CPUNS
			n++
		}
	}
	return ns, n
}

// trEntries is the data of a journal's entries of one kind, in order.
func trEntries(j *attest.Journal, kind attest.EntryKind) [][]byte {
	var out [][]byte
	for _, e := range j.Entries {
		if e.Kind == kind {
			out = append(out, e.Data)
		}
	}
	return out
}

// trJournals is each Executed segment's replay journal, in order.
func trJournals(t *testing.T, d *daemon, s api.Show) []*attest.Journal {
	t.Helper()
	var out []*attest.Journal
	for _, seg := range s.Segments {
		if seg.Kind == "executed" {
			_, j := d.journal(t, seg)
			out = append(out, j)
		}
	}
	return out
}

// trAccount is an interval's expected account.
type trAccount struct{ dispatched, resolved []string }

// trCheckAccounts checks the accounts of a run's Executed segments, in
// order.
func trCheckAccounts(t *testing.T, s api.Show, want []trAccount) {
	t.Helper()
	i := 0
	for _, seg := range s.Segments {
		if seg.Kind != "executed" {
			continue
		}
		if i >= len(want) {
			t.Fatalf("run %s: more than %d executed segments:%s", s.Run.ID, len(want), fmtSegments(s.Segments))
		}
		w := want[i]
		if seg.Calls == nil || seg.Interval != uint64(i+1) ||
			!slices.Equal(seg.Calls.Dispatched, nonNilStrings(w.dispatched)) || !slices.Equal(seg.Calls.Resolved, nonNilStrings(w.resolved)) {
			t.Fatalf("run %s: interval %d (segment %d, interval %d) accounts %+v, want dispatched %q resolved %q",
				s.Run.ID, i+1, seg.Index, seg.Interval, seg.Calls, w.dispatched, w.resolved)
		}
		i++
	}
	if i != len(want) {
		t.Fatalf("run %s: %d executed segments, want %d", s.Run.ID, i, len(want))
	}
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// trCheckForms checks that every Suspended segment of a run is a
// transcript park whose manifest names exactly what a transcript resume
// needs, and that every Resumed segment resumes the snapshot before it with
// idle energy: more than zero (the park retained the transcript's bytes)
// and labelled estimated.
func trCheckForms(t *testing.T, d *daemon, s api.Show, digest string) {
	t.Helper()
	var last api.Segment
	for _, seg := range s.Segments {
		switch seg.Kind {
		case "suspended":
			if seg.Form != "transcript" || !strings.HasPrefix(seg.Snapshot, "transcript ") {
				t.Fatalf("run %s: segment %d is not a transcript park: %+v", s.Run.ID, seg.Index, seg)
			}
			m, err := manifest.Decode(d.object(t, seg.Manifest))
			if err != nil {
				t.Fatalf("segment %d: manifest: %v", seg.Index, err)
			}
			var keys []string
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			want := slices.Sorted(slices.Values(manifest.TranscriptKeys))
			if !slices.Equal(keys, want) || m[manifest.ImageDigest] != digest || m[manifest.Protocol] != protocol.Version {
				t.Fatalf("segment %d: a transcript park's manifest %v, want the keys %v, image %s, protocol %s", seg.Index, m, want, digest, protocol.Version)
			}
			last = seg
		case "resumed":
			if seg.Form != "transcript" || seg.Snapshot != last.Snapshot || seg.Idle == nil || seg.Idle.UJ == 0 || seg.Idle.Provenance != "estimated" {
				t.Fatalf("run %s: resumed segment %d %+v (idle %+v); the park before it %+v", s.Run.ID, seg.Index, seg, seg.Idle, last)
			}
		}
	}
}

// trSealed is the transcript a Suspended segment's snapshot names.
func trSealed(t *testing.T, d *daemon, seg api.Segment) string {
	t.Helper()
	addr, ok := strings.CutPrefix(seg.Snapshot, "transcript ")
	if !ok {
		t.Fatalf("segment %d: snapshot %q is not a transcript", seg.Index, seg.Snapshot)
	}
	return string(d.object(t, addr))
}

// trCheckTranscript checks a run's transcript: the appends its intervals'
// journals hold make want, and each transcript a park sealed is what the
// intervals before it had appended.
func trCheckTranscript(t *testing.T, d *daemon, s api.Show, want string) {
	t.Helper()
	var got strings.Builder
	js := trJournals(t, d, s)
	n := 0
	for _, seg := range s.Segments {
		switch seg.Kind {
		case "executed":
			for _, b := range trEntries(js[n], attest.Transcript) {
				got.Write(b)
			}
			n++
		case "suspended":
			if sealed := trSealed(t, d, seg); sealed != got.String() {
				t.Fatalf("run %s: segment %d sealed the transcript\n%s\nthe intervals before it appended\n%s", s.Run.ID, seg.Index, sealed, got.String())
			}
		}
	}
	if got.String() != want {
		t.Fatalf("run %s: the transcript is\n%s\nwant\n%s", s.Run.ID, got.String(), want)
	}
}

// trNothingResident waits briefly for a transcript run's sandboxes to be
// gone: no cgroup and no process (the shim) of any of its intervals.
func trNothingResident(t *testing.T, d *daemon, id string) {
	t.Helper()
	sandboxes := id + "_t"
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, pat := range []string{"/sys/fs/cgroup/*/runrecordd*/" + sandboxes + "*", "/sys/fs/cgroup/runrecordd*/" + sandboxes + "*"} {
			m, _ := filepath.Glob(pat)
			left = append(left, m...)
		}
		for _, p := range d.processes() {
			if strings.Contains(p, " "+sandboxes) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is parked, but its sandboxes left: %s", id, strings.Join(left, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTranscriptAgentThreeCycles runs the agent through three steps, each
// a dispatch and an await that parks it by its transcript, and posts each
// result after a delay. While it waits: the call is listed with its
// payload, nothing of the run is resident, its receipts' CPU time does not
// grow, and the interval the await ended is short beside the wait. Each
// post resumes it. At the end: exit 0, four intervals accounting exactly
// for the calls, transcript parks and resumes with estimated idle energy,
// NonBlocking, and the transcript the agent wrote, whole in its journals
// and sealed at each park.
func TestTranscriptAgentThreeCycles(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := trShared(t)
	const id = "tr-agent"
	trStart(t, d, id, trAgentImage, "STEPS=3")

	waits := []time.Duration{1500 * time.Millisecond, 2500 * time.Millisecond, 2 * time.Second}
	payloads := map[string]json.RawMessage{}
	var resumes []api.Resume
	for n := 1; n <= 3; n++ {
		call := fmt.Sprintf("call-%d", n)
		trParked(t, d, id, 3*n-1)

		// The call waits for a result, with its payload.
		cs := trCalls(t, d, id)
		var p struct {
			Step   int    `json:"step"`
			Digest string `json:"digest"`
		}
		if len(cs) != 1 || cs[0].ID != call || cs[0].Kind != "build" || cs[0].Phase != "parked" || cs[0].ResultPosted ||
			json.Unmarshal(cs[0].Payload, &p) != nil || p.Step != n || len(p.Digest) != 16 {
			t.Fatalf("parked at step %d, the run's calls are %+v; want %s (build) with its payload", n, cs, call)
		}
		payloads[call] = cs[0].Payload

		// Waiting costs no computation: nothing is resident and the
		// receipts' CPU time stays what it was at the park.
		before := mustShow(t, d, id)
		cpu, intervals := trCPU(before)
		ex := before.Segments[len(before.Segments)-2]
		if ex.Kind != "executed" || ex.Outcome != "parked" || ex.Interval != uint64(n) || ex.CPUNS == 0 || ex.Start == nil || ex.End == nil {
			t.Fatalf("step %d: the parking interval %+v", n, ex)
		}
		wall := ex.End.Sub(*ex.Start)
		trNothingResident(t, d, id)
		time.Sleep(waits[n-1])
		after := mustShow(t, d, id)
		cpuAfter, intervalsAfter := trCPU(after)
		if cpuAfter != cpu || intervalsAfter != intervals || after.Run.Head != before.Run.Head || after.Run.Phase != "parked" {
			t.Fatalf("step %d: waiting %v, the run's CPU time went from %v over %d intervals to %v over %d (head %s → %s, %s)",
				n, waits[n-1], time.Duration(cpu), intervals, time.Duration(cpuAfter), intervalsAfter, before.Run.Head, after.Run.Head, after.Run.Phase)
		}
		trNothingResident(t, d, id)
		// The await ended the interval: it lasted a fraction of the wait.
		if wall <= 0 || wall >= waits[n-1] {
			t.Fatalf("step %d: the parking interval lasted %v, the wait %v", n, wall, waits[n-1])
		}
		t.Logf("step %d: interval %d lasted %v (cpu %v); parked for %v, the run's CPU time stayed %v",
			n, n, wall.Round(time.Millisecond), time.Duration(ex.CPUNS).Round(time.Microsecond), waits[n-1], time.Duration(cpu).Round(time.Microsecond))

		// Posting the result resumes it.
		pr := trPost(t, d, id, call, trResult(n))
		if time.Duration(pr.Resumed.ParkedNS) < waits[n-1] {
			t.Fatalf("step %d: parked %v by the daemon's count, the test waited %v", n, time.Duration(pr.Resumed.ParkedNS), waits[n-1])
		}
		resumes = append(resumes, *pr.Resumed)
		t.Logf("step %d: post resumed it in %v; idle %d µJ %s over %v", n, time.Duration(pr.Resumed.DurationNS).Round(time.Millisecond),
			pr.Resumed.Idle.UJ, pr.Resumed.Idle.Provenance, time.Duration(pr.Resumed.ParkedNS).Round(time.Millisecond))
		// No call of the run waits for a result any more: the posted one
		// is delivered already, or listed with its result posted.
		for _, c := range trCalls(t, d, id) {
			if c.ID == call && !c.ResultPosted || c.ID != call && c.ID != fmt.Sprintf("call-%d", n+1) {
				t.Fatalf("after posting %s, the run's calls are %+v", call, trCalls(t, d, id))
			}
		}
	}

	r := trClosed(t, d, id)
	if cs := trCalls(t, d, id); len(cs) != 0 {
		t.Fatalf("closed, the run still lists calls %+v", cs)
	}
	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), strings.Repeat("executed suspended resumed ", 3)+"executed closed"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	if last := s.Segments[10]; last.Reason != "unit exited with code 0" || r.Segments != 11 || r.Head != last.Head {
		t.Fatalf("closed %+v: %+v", r, last)
	}
	for i, want := range []string{"parked", "parked", "parked", "exited(0)"} {
		if got := s.Segments[3*i].Outcome; got != want {
			t.Fatalf("interval %d's outcome %s, want %s", i+1, got, want)
		}
	}
	trCheckAccounts(t, s, []trAccount{
		{[]string{"call-1"}, nil},
		{[]string{"call-2"}, []string{"call-1"}},
		{[]string{"call-3"}, []string{"call-2"}},
		{nil, []string{"call-3"}},
	})
	trCheckForms(t, d, s, trAgentDigest)
	for i, r := range resumes {
		if re := s.Segments[3*i+2]; re.Idle.UJ != r.Idle.UJ {
			t.Fatalf("resumed segment %d: idle %+v; the post's resume reported %+v", re.Index, re.Idle, r.Idle)
		}
	}

	// NonBlocking, every interval accounted.
	wp, err := d.c.WaitProof(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if wp.Verdict != "NonBlocking" || wp.Segment != nil || !strings.HasPrefix(wp.Reason, "4 accounted intervals") || s.WaitProof.Verdict != wp.Verdict {
		t.Fatalf("wait proof %+v (show: %+v), want NonBlocking over 4 accounted intervals", wp, s.WaitProof)
	}
	t.Logf("wait proof: %s: %s", wp.Verdict, wp.Reason)

	// The transcript, and what each interval's journal says it did.
	trCheckTranscript(t, d, s, trAgentTranscript(3))
	for i, j := range trJournals(t, d, s) {
		n := i + 1
		var dispatched []protocol.Call
		for _, b := range trEntries(j, attest.Dispatch) {
			var c protocol.Call
			if err := json.Unmarshal(b, &c); err != nil {
				t.Fatalf("interval %d: dispatch entry %q: %v", n, b, err)
			}
			dispatched = append(dispatched, c)
		}
		var results []protocol.Result
		for _, b := range trEntries(j, attest.Result) {
			var r protocol.Result
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("interval %d: result entry %q: %v", n, b, err)
			}
			results = append(results, r)
		}
		if n <= 3 {
			call := fmt.Sprintf("call-%d", n)
			if len(dispatched) != 1 || dispatched[0].ID != call || dispatched[0].Kind != "build" || !bytes.Equal(dispatched[0].Payload, payloads[call]) ||
				!lifecycleAwait(j, call) {
				b, _ := json.Marshal(dispatched)
				t.Fatalf("interval %d's journal: dispatched %s, await %v; the calls listed %s with %s", n, b, lifecycleAwait(j, call), call, payloads[call])
			}
		} else if len(dispatched) != 0 {
			t.Fatalf("interval 4 dispatched %+v", dispatched)
		}
		if n > 1 {
			call := fmt.Sprintf("call-%d", n-1)
			if len(results) != 1 || results[0].ID != call || string(results[0].Payload) != trResult(n-1) {
				t.Fatalf("interval %d's journal: results %+v, want %s's", n, results, call)
			}
		} else if len(results) != 0 {
			t.Fatalf("interval 1 was delivered %+v", results)
		}
	}
}

// lifecycleAwait reports whether a journal records an await of exactly
// call.
func lifecycleAwait(j *attest.Journal, call string) bool {
	var ids []string
	return lifecycleEntry(j, "await", &ids) && slices.Equal(ids, []string{call})
}

// TestTranscriptPollerBlocked runs the poller, which dispatches call-1 and
// polls for its result inside the same interval, and posts the result
// while it runs: the post resumes nothing (nothing is parked), the poller
// reads it and exits, the run closes by itself, and its wait proof is
// Blocked at segment 0 — through the API and the CLI, naming the call.
func TestTranscriptPollerBlocked(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := trShared(t)
	const id = "tr-poller"
	trStart(t, d, id, trPollerImage)

	// The call is listed while the poller runs and polls.
	var cs []api.Call
	deadline := time.Now().Add(30 * time.Second)
	for cs = trCalls(t, d, id); len(cs) == 0; cs = trCalls(t, d, id) {
		if time.Now().After(deadline) {
			r, err := d.run(ctx, id)
			t.Fatalf("the poller's call was never listed; the run %+v, %v", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(cs) != 1 || cs[0].ID != "call-1" || cs[0].Phase != "executing" || cs[0].ResultPosted || string(cs[0].Payload) != `{"poller":true}` {
		t.Fatalf("the poller's calls %+v", cs)
	}
	time.Sleep(300 * time.Millisecond) // a few polls come back empty
	if r, err := d.run(ctx, id); err != nil || r.Phase != "executing" {
		t.Fatalf("polling: %+v, %v", r, err)
	}
	pr, err := d.c.PostResult(ctx, id, "call-1", []byte(`{"artifact": "sha256:p"}`))
	if err != nil {
		t.Fatal(err)
	}
	if pr.Resumed != nil || pr.ResumeError != nil || len(pr.Awaiting) != 0 {
		t.Fatalf("posting to a running unit: %+v", pr)
	}

	trClosed(t, d, id)
	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), "executed closed"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	if s.Segments[0].Outcome != "exited(0)" || s.Segments[1].Reason != "unit exited with code 0" {
		t.Fatalf("segments %+v", s.Segments)
	}
	trCheckAccounts(t, s, []trAccount{{[]string{"call-1"}, []string{"call-1"}}})
	trCheckTranscript(t, d, s, "dispatched call-1\nresult {\"artifact\":\"sha256:p\"}\n")

	wp, err := d.c.WaitProof(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if wp.Verdict != "Blocked" || wp.Segment == nil || *wp.Segment != 0 || !strings.Contains(wp.Reason, `"call-1"`) ||
		s.WaitProof.Verdict != "Blocked" || s.WaitProof.Segment == nil || *s.WaitProof.Segment != 0 {
		t.Fatalf("wait proof %+v (show: %+v), want Blocked at segment 0 naming call-1", wp, s.WaitProof)
	}
	// What the CLI prints.
	cmd := exec.Command(daemonBinary, "wait-proof", "--socket", d.socket, id)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("runrecordd wait-proof %s: %v\n%s", id, err, out)
	}
	if line := strings.TrimSpace(string(out)); !strings.HasPrefix(line, "Blocked at segment 0: ") || !strings.Contains(line, "call-1") {
		t.Fatalf("runrecordd wait-proof %s: %q", id, line)
	}
	t.Logf("runrecordd wait-proof %s: %s", id, bytes.TrimSpace(out))
}

// TestTranscriptRefusals posts the results the daemon must refuse to an
// agent run (STEPS=2) as it goes: for a call it never dispatched, a second
// result for a call (the first kept while the resume it triggered was
// refused), for a call an earlier interval resolved, and for the closed
// run. Each is refused with its code and changes nothing: the same head
// and segments, the same wait proof, never Malformed. The run goes on
// through all of it and finishes with the first result the call got.
func TestTranscriptRefusals(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := trShared(t)
	const id = "tr-refusals"
	// A name of its own: the second-result case swaps its image.
	const image = "runrecordd.test/agent-refusals:1"
	mustImportImage(t, d, trAgentArchive, image, trAgentDigest)
	t.Cleanup(func() {
		if d.running() {
			mustImportImage(t, d, trAgentArchive, image, trAgentDigest)
		}
	})
	trStart(t, d, id, image, "STEPS=2")
	trParked(t, d, id, 2)

	refuse := func(t *testing.T, run, call, payload, code string) {
		t.Helper()
		if code == "not_found" {
			_, err := d.c.PostResult(ctx, run, call, []byte(payload))
			apiError(t, err, code)
			if _, err := d.run(ctx, run); err == nil {
				t.Fatalf("a result for %s made the run", run)
			}
			return
		}
		was, err := d.run(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		wp, err := d.c.WaitProof(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		calls := trCalls(t, d, run)
		_, err = d.c.PostResult(ctx, run, call, []byte(payload))
		ae := apiError(t, err, code)
		t.Logf("%s's %s: refused as it should be: %s: %v", run, call, ae.Code, ae)
		unchanged(t, d, run, was)
		now, err := d.c.WaitProof(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		if now.Verdict != wp.Verdict || now.Reason != wp.Reason || now.Verdict == "Malformed" {
			t.Fatalf("wait proof %+v after the refusal, %+v before", now, wp)
		}
		if got := trCalls(t, d, run); !slices.EqualFunc(got, calls, func(a, b api.Call) bool {
			return a.ID == b.ID && a.ResultPosted == b.ResultPosted && a.Phase == b.Phase
		}) {
			t.Fatalf("calls %+v after the refusal, %+v before", got, calls)
		}
	}

	t.Run("UnknownCall", func(t *testing.T) {
		refuse(t, id, "call-9", `{}`, "call_refused")
		refuse(t, id, "call-2", `{}`, "call_refused") // not dispatched yet
		refuse(t, "tr-no-such-run", "call-1", `{}`, "not_found")
		refuse(t, id, "call-1", `{"not json`, "bad_request")
	})

	t.Run("SecondResult", func(t *testing.T) {
		// Another image under the unit's name: the post's resume is
		// refused (manifest_mismatch), the result kept, the run parked.
		was, err := d.run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		mustImportImage(t, d, trAgentVariantArchive, image, trAgentVariantDigest)
		pr, err := d.c.PostResult(ctx, id, "call-1", []byte(trResult(1)))
		if err != nil {
			t.Fatal(err)
		}
		if pr.Resumed != nil || pr.ResumeError == nil || pr.ResumeError.Code != "manifest_mismatch" || !slices.Equal(pr.ResumeError.Keys, []string{"image.digest"}) {
			t.Fatalf("post with the image swapped: %+v (resume error %+v)", pr, pr.ResumeError)
		}
		unchanged(t, d, id, was)
		if cs := trCalls(t, d, id); len(cs) != 1 || cs[0].ID != "call-1" || !cs[0].ResultPosted || cs[0].Phase != "parked" {
			t.Fatalf("calls with the result kept: %+v", cs)
		}
		refuse(t, id, "call-1", `{"second":true}`, "call_refused")

		// With the image put back, a resume delivers the first result.
		mustImportImage(t, d, trAgentArchive, image, trAgentDigest)
		r, err := d.c.Resume(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Run.Phase != "executing" || r.Idle.UJ == 0 || r.Idle.Provenance != "estimated" {
			t.Fatalf("resumed %+v", r)
		}
		trParked(t, d, id, 5)
	})

	t.Run("ResolvedCall", func(t *testing.T) {
		refuse(t, id, "call-1", trResult(1), "call_refused")
	})

	t.Run("ClosedRun", func(t *testing.T) {
		trPost(t, d, id, "call-2", trResult(2))
		trClosed(t, d, id)
		refuse(t, id, "call-2", trResult(2), "phase")
		refuse(t, id, "call-1", trResult(1), "phase")
		refuse(t, id, "call-9", `{}`, "phase")
	})
	if t.Failed() {
		return
	}

	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), strings.Repeat("executed suspended resumed ", 2)+"executed closed"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	if s.Segments[7].Reason != "unit exited with code 0" {
		t.Fatalf("closed: %+v", s.Segments[7])
	}
	trCheckAccounts(t, s, []trAccount{
		{[]string{"call-1"}, nil},
		{[]string{"call-2"}, []string{"call-1"}},
		{nil, []string{"call-2"}},
	})
	trCheckForms(t, d, s, trAgentDigest)
	trCheckTranscript(t, d, s, trAgentTranscript(2))
	if s.WaitProof.Verdict != "NonBlocking" {
		t.Fatalf("wait proof %+v", s.WaitProof)
	}
}

// TestTranscriptOnSecondHost parks the agent (STEPS=2) on one daemon
// awaiting call-2, after one resume there, and exports it: the bundle holds
// no image data — no directory listing, every park a transcript, a few
// KiB in all. A fresh daemon imports it and, with the agent's image
// imported, resumes it when call-2's result is posted there; the agent
// finishes on the second host. Its record is the first host's segments
// with the second's after them, and verifies from genesis; NonBlocking.
//
// The first host is a fresh daemon too, so that the run's first
// attestation starts the host's audit chain; TestTranscriptBundleFromBusyHost
// exports from a host that attested other runs first.
func TestTranscriptOnSecondHost(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := mustDaemon(t, "tr-first")
	mustImportImage(t, a, trAgentArchive, trAgentImage, trAgentDigest)
	const id = "tr-hop"
	trStart(t, a, id, trAgentImage, "STEPS=2")
	trParked(t, a, id, 2)
	trPost(t, a, id, "call-1", trResult(1))
	trParked(t, a, id, 5)
	showA := mustShow(t, a, id)
	callsA := trCalls(t, a, id)

	var bundle bytes.Buffer
	if err := a.c.Export(ctx, id, &bundle); err != nil {
		t.Fatalf("export: %v", err)
	}
	// No image data: every park a transcript, no object a directory
	// listing (an image park's rootfs or CRIU image), a few KiB in all.
	trCheckForms(t, a, showA, trAgentDigest)
	transcripts := map[string]bool{}
	for _, seg := range showA.Segments {
		if seg.Kind == "suspended" {
			transcripts[strings.TrimPrefix(strings.TrimPrefix(seg.Snapshot, "transcript "), "b3:")] = true
		}
	}
	read, _, err := bundletest.Read(bundle.Bytes())
	if err != nil {
		t.Fatalf("bundle: %v", err)
	}
	objects := len(read.Objects)
	for _, o := range read.Objects {
		name := strings.TrimPrefix(o.Addr.String(), "b3:")
		delete(transcripts, name)
		if bytes.HasPrefix(o.Bytes, []byte(store.DirDomain)) {
			t.Fatalf("bundle: object %s is a directory listing (%d bytes): image data in a transcript run's bundle", name, len(o.Bytes))
		}
	}
	if len(transcripts) != 0 || objects == 0 || bundle.Len() >= 64<<10 {
		t.Fatalf("bundle: %d bytes, %d objects; transcripts missing from it: %v", bundle.Len(), objects, transcripts)
	}
	t.Logf("bundle: %d bytes, %d objects", bundle.Len(), objects)

	b := mustDaemon(t, "tr-second")
	hostA, err := a.c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hostB, err := b.c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hostA.KeyID == hostB.KeyID || hostA.Containerd == hostB.Containerd {
		t.Fatalf("not a second host: %+v and %+v", hostA, hostB)
	}
	trustHost(t, a, b)
	im, err := b.c.Import(ctx, bytes.NewReader(bundle.Bytes()), "")
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if im.Run.ID != id || im.Run.Phase != "parked" || im.Run.Status != "parked (transcript)" || im.Run.Head != showA.Run.Head ||
		im.Run.Segments != showA.Run.Segments || im.Objects != objects {
		t.Fatalf("imported %+v (%d objects); exported %+v (%d objects)", im.Run, im.Objects, showA.Run, objects)
	}
	mustImportImage(t, b, trAgentArchive, trAgentImage, trAgentDigest)
	// B lists the call A was waiting on, with the payload A's journal holds.
	callsB := trCalls(t, b, id)
	if len(callsA) != 1 || len(callsB) != 1 || callsB[0].ID != "call-2" || callsB[0].Kind != callsA[0].Kind ||
		!bytes.Equal(callsB[0].Payload, callsA[0].Payload) || callsB[0].ResultPosted {
		t.Fatalf("calls on B %+v; on A %+v", callsB, callsA)
	}

	pr := trPost(t, b, id, "call-2", trResult(2))
	t.Logf("resumed on B in %v; idle %d µJ %s over %v", time.Duration(pr.Resumed.DurationNS).Round(time.Millisecond),
		pr.Resumed.Idle.UJ, pr.Resumed.Idle.Provenance, time.Duration(pr.Resumed.ParkedNS).Round(time.Millisecond))
	trClosed(t, b, id)

	v, err := b.c.Verify(ctx, id)
	if err != nil || !v.OK || v.Phase != "closed" {
		t.Fatalf("verify on B: %+v, %v", v, err)
	}
	showB := mustShow(t, b, id)
	if got, want := kinds(showB.Segments), strings.Repeat("executed suspended resumed ", 2)+"executed closed"; got != want {
		t.Fatalf("segments on B %s, want %s", got, want)
	}
	for i, s := range showA.Segments {
		if sb := showB.Segments[i]; sb.Kind != s.Kind || sb.Head != s.Head || sb.Attestation != s.Attestation || sb.Snapshot != s.Snapshot {
			t.Fatalf("segment %d on B %+v, on A %+v", i, sb, s)
		}
	}
	for i, host := range []string{hostA.KeyID, hostA.KeyID, hostB.KeyID} {
		if seg := showB.Segments[3*i]; seg.Host != host {
			t.Fatalf("interval %d was attested by %s, want %s (A %s, B %s)", i+1, seg.Host, host, hostA.KeyID, hostB.KeyID)
		}
	}
	if last := showB.Segments[7]; last.Reason != "unit exited with code 0" {
		t.Fatalf("closed on B: %+v", last)
	}
	trCheckAccounts(t, showB, []trAccount{
		{[]string{"call-1"}, nil},
		{[]string{"call-2"}, []string{"call-1"}},
		{nil, []string{"call-2"}},
	})
	trCheckForms(t, b, showB, trAgentDigest)
	trCheckTranscript(t, b, showB, trAgentTranscript(2))
	wp, err := b.c.WaitProof(ctx, id)
	if err != nil || wp.Verdict != "NonBlocking" || wp.Segment != nil || v.WaitProof.Verdict != "NonBlocking" {
		t.Fatalf("wait proof on B %+v, %v", wp, err)
	}
	// A still holds the run as it exported it, handed off.
	handedOff(t, a, id, showA.Run)
}

// TestTranscriptBundleFromBusyHost parks an agent run on a host that has
// attested another run before it, so that the run's first attestation names
// that run's as its audit_prev (the host's audit chain), and moves it to a
// fresh daemon: the import must take the bundle — the other run's
// attestation is no part of this run's record — and the run must resume
// there on its posted result and finish, NonBlocking.
func TestTranscriptBundleFromBusyHost(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := trShared(t)
	const before, id = "tr-busy-before", "tr-busy"
	trStart(t, a, before, trAgentImage, "STEPS=1")
	trParked(t, a, before, 2)
	trStart(t, a, id, trAgentImage, "STEPS=1")
	trParked(t, a, id, 2)
	showA := mustShow(t, a, id)
	body, _ := a.journal(t, showA.Segments[0])
	if body.AuditPrev == nil {
		t.Fatalf("%s's first attestation names no audit_prev, though %s was attested before it", id, before)
	}
	t.Logf("%s's first attestation: audit_prev %s", id, body.AuditPrev)

	var bundle bytes.Buffer
	if err := a.c.Export(ctx, id, &bundle); err != nil {
		t.Fatalf("export: %v", err)
	}
	b := mustDaemon(t, "tr-busy-second")
	trustHost(t, a, b)
	im, err := b.c.Import(ctx, bytes.NewReader(bundle.Bytes()), "")
	if err != nil {
		t.Fatalf("import on a fresh host: %v\n(the bundle holds %s's record and the objects it reaches; its first attestation's audit_prev %s, "+
			"the previous attestation of the exporting host's audit chain, is no part of it)", err, id, body.AuditPrev)
	}
	if im.Run.Phase != "parked" || im.Run.Head != showA.Run.Head {
		t.Fatalf("imported %+v; exported %+v", im.Run, showA.Run)
	}
	mustImportImage(t, b, trAgentArchive, trAgentImage, trAgentDigest)
	trPost(t, b, id, "call-1", trResult(1))
	trClosed(t, b, id)
	if v, err := b.c.Verify(ctx, id); err != nil || !v.OK || v.WaitProof.Verdict != "NonBlocking" {
		t.Fatalf("verify on B: %+v, %v", v, err)
	}
	trCheckTranscript(t, b, mustShow(t, b, id), trAgentTranscript(1))
}

// TestTranscriptResultBeforePark posts call-1's result the moment the
// event stream says the agent (STEPS=1, no thinking) dispatched it: just
// before, or while, the daemon parks the run on the agent's await. Either
// way the result must reach the unit — delivered inside the interval (an
// honest Blocked), or resuming the run it parked (NonBlocking) — and the
// agent must finish. A run left parked with every result its await named
// posted has lost its wakeup: nothing would ever resume it. Three runs,
// since it is a race.
func TestTranscriptResultBeforePark(t *testing.T) {
	privileged(t)
	d := trShared(t)
	for i := range 3 {
		id := fmt.Sprintf("tr-early-%d", i)
		trResultBeforePark(t, d, id)
	}
}

func trResultBeforePark(t *testing.T, d *daemon, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	posted := make(chan error, 1)
	go func() {
		err := d.c.Events(ctx, func(e api.Event) bool {
			if e.Run != id || e.Kind != "call.dispatched" {
				return true
			}
			_, err := d.c.PostResult(ctx, id, "call-1", []byte(trResult(1)))
			posted <- err
			return false
		})
		if err != nil {
			posted <- err
		}
	}()
	time.Sleep(200 * time.Millisecond) // the stream subscribes
	trStart(t, d, id, trAgentImage, "STEPS=1", "WORK_ITERS=0")
	select {
	case err := <-posted:
		if err != nil {
			t.Fatalf("%s: posting call-1 on its dispatch: %v", id, err)
		}
	case <-ctx.Done():
		t.Fatalf("%s: no call.dispatched event", id)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := d.run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Phase == "closed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: 5s after call-1's result was posted the run is %s, its calls %+v: the result that resolves its await is posted, "+
				"and nothing resumes it", id, r.Status, trCalls(t, d, id))
		}
		time.Sleep(20 * time.Millisecond)
	}
	s := mustShow(t, d, id)
	if last := s.Segments[len(s.Segments)-1]; last.Reason != "unit exited with code 0" {
		t.Fatalf("%s closed: %+v", id, last)
	}
	if v := s.WaitProof.Verdict; v != "NonBlocking" && v != "Blocked" {
		t.Fatalf("%s: wait proof %+v", id, s.WaitProof)
	}
	trCheckTranscript(t, d, s, trAgentTranscript(1))
	t.Logf("%s: %s; %s", id, kinds(s.Segments), s.WaitProof.Verdict)
}

// TestTranscriptWatch watches the daemon's events while an agent run
// (STEPS=1) goes through its one cycle, posting the result when the stream
// says it parked: the run's events are exactly run.started,
// call.dispatched, run.parked, call.result, run.resumed and run.closed, in
// that order. A unit cannot dispatch in a run the daemon has not yet
// announced (or stored).
func TestTranscriptWatch(t *testing.T) {
	privileged(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	d := trShared(t)
	const id = "tr-watch"

	events := make(chan api.Event, 64)
	done := make(chan error, 1)
	go func() {
		done <- d.c.Events(ctx, func(e api.Event) bool {
			if e.Run != id && e.Kind != "events.dropped" {
				return true
			}
			events <- e
			return e.Kind != "run.closed"
		})
		close(events)
	}()
	// The stream subscribes when its request reaches the daemon, well
	// before a sandbox can start; give it that moment.
	time.Sleep(200 * time.Millisecond)
	// No thinking: the agent dispatches as soon as it has said hello, so
	// an event of the run published late shows.
	trStart(t, d, id, trAgentImage, "STEPS=1", "WORK_ITERS=0")

	var got []api.Event
	for e := range events {
		got = append(got, e)
		t.Logf("event %s %s %s %s", e.Kind, e.Call, e.CallKind, e.Detail)
		if e.Kind == "run.parked" {
			trPost(t, d, id, "call-1", trResult(1))
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("events: %v", err)
	}
	var ks []string
	for _, e := range got {
		ks = append(ks, e.Kind)
	}
	want := []string{"run.started", "call.dispatched", "run.parked", "call.result", "run.resumed", "run.closed"}
	if !slices.Equal(ks, want) {
		t.Fatalf("events %v, want %v", ks, want)
	}
	for i, e := range got {
		if e.Time.IsZero() || i > 0 && e.Time.Before(got[i-1].Time) {
			t.Fatalf("event %d %+v: time out of order", i, e)
		}
	}
	if e := got[0]; e.Detail != "transcript" {
		t.Fatalf("run.started %+v", e)
	}
	if e := got[1]; e.Call != "call-1" || e.CallKind != "build" {
		t.Fatalf("call.dispatched %+v", e)
	}
	if e := got[2]; !strings.HasPrefix(e.Detail, "transcript ") {
		t.Fatalf("run.parked %+v", e)
	}
	if e := got[3]; e.Call != "call-1" {
		t.Fatalf("call.result %+v", e)
	}
	if e := got[5]; e.Detail != "unit exited with code 0" {
		t.Fatalf("run.closed %+v", e)
	}
	s := mustShow(t, d, id)
	trCheckAccounts(t, s, []trAccount{{[]string{"call-1"}, nil}, {nil, []string{"call-1"}}})
	trCheckTranscript(t, d, s, trAgentTranscript(1))
	if s.WaitProof.Verdict != "NonBlocking" {
		t.Fatalf("wait proof %+v", s.WaitProof)
	}
}
