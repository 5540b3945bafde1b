//go:build linux

package e2e

import (
	"bytes"
	"context"
	"math/big"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// TestImageParkResumeTwice parks the oracle and resumes it, twice in a row:
// each time it goes on as the same process with the same state (the
// buffer's checksum recomputed over the restored memory, the pids, the
// start time, the open file's offset, the pipe), counting on from where it
// was. Then `show` has both parks' CRIU statistics, both resumes' idle
// energy labelled estimated, and totals that add up; each interval's
// journal holds the output it attests, and together they hold all of it.
func TestImageParkResumeTwice(t *testing.T) {
	privileged(t)
	d := shared(t)
	const id = "twice"
	startOracle(t, d, id, oracleImage)

	var parks []api.Park
	var resumes []api.Resume
	var atParks []line
	for round := 1; round <= 2; round++ {
		p, atPark := park(t, d, id)
		r := resume(t, d, id, nil, atPark)
		parks, resumes, atParks = append(parks, p), append(resumes, r), append(atParks, atPark)
	}

	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), "executed suspended resumed executed suspended resumed"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	if s.Run.Phase != "executing" || s.Run.Status != "running" || s.Run.Segments != 6 || s.Run.Head != s.Segments[5].Head {
		t.Fatalf("run %+v", s.Run)
	}
	if s.Stdout != d.stdout(id) || s.Unit == nil || s.Unit.Image != oracleImage || s.Unit.ImageDigest != oracleDigest {
		t.Fatalf("show: stdout %s, unit %+v", s.Stdout, s.Unit)
	}
	var receipts, idle uint64
	for i := range 2 {
		ex, su, re := s.Segments[3*i], s.Segments[3*i+1], s.Segments[3*i+2]
		p, r := parks[i], resumes[i]
		// The park's CRIU statistics, as the park reported them.
		if ex.Outcome != "parked" || ex.Interval != uint64(i+1) || ex.Checkpoint == nil || *ex.Checkpoint != *p.Checkpoint {
			t.Fatalf("park %d: executed segment %+v (checkpoint %+v); the park reported %+v", i+1, ex, ex.Checkpoint, p.Checkpoint)
		}
		cp := ex.Checkpoint
		if cp.FrozenNS <= 0 || cp.MemDumpNS <= 0 || cp.MemWriteNS <= 0 || cp.TotalNS <= 0 || cp.Pages < 64<<20/4096 {
			t.Fatalf("park %d: checkpoint statistics %+v", i+1, cp)
		}
		if ex.Receipt == nil || ex.Receipt.UJ == 0 || ex.CPUNS == 0 || (ex.Receipt.Provenance != "estimated" && ex.Receipt.Provenance != "measured") {
			t.Fatalf("park %d: receipt %+v, cpu %d ns", i+1, ex.Receipt, ex.CPUNS)
		}
		if su.Snapshot != p.Snapshot || su.Manifest != p.Manifest || su.Form != "image" {
			t.Fatalf("park %d: suspended segment %+v; the park reported %s, %s", i+1, su, p.Snapshot, p.Manifest)
		}
		// The resume's idle energy: never zero for a park that kept
		// 64 MiB, and an estimate on a host that cannot measure disks.
		if re.Snapshot != p.Snapshot || re.Idle == nil || re.Idle.UJ == 0 || re.Idle.UJ != r.Idle.UJ || re.Idle.Provenance != "estimated" {
			t.Fatalf("resume %d: resumed segment %+v (idle %+v); the resume reported %+v", i+1, re, re.Idle, r.Idle)
		}
		receipts += ex.Receipt.UJ
		idle += re.Idle.UJ
	}
	tot := s.Totals
	if tot.ActiveUJ != receipts || tot.IdleUJ != idle || tot.CostUJ != tot.ActiveUJ+tot.IdleUJ || tot.IdleProvenance != "estimated" {
		t.Fatalf("totals %+v; receipts sum to %d µJ, idle to %d µJ", tot, receipts, idle)
	}
	t.Logf("totals: active %d µJ (%s), idle %d µJ (%s), cost %d µJ", tot.ActiveUJ, tot.ActiveProvenance, tot.IdleUJ, tot.IdleProvenance, tot.CostUJ)

	// Each interval's replay journal holds output it attests: a run of the
	// stdout file after the previous interval's; the second interval's
	// begins with its restore and the idle energy its resume recorded.
	out, err := os.ReadFile(d.stdout(id))
	if err != nil {
		t.Fatal(err)
	}
	ls := output(t, d.stdout(id))
	type cover struct {
		start, firstLine int64 // the attested start; the unit's first line
		prevEnd          int64 // the interval before's end (0: none)
		gap              []byte
	}
	var covers []cover
	off := 0
	var prevEnd int64
	for i := range 2 {
		body, j := d.journal(t, s.Segments[3*i])
		got := stdoutOf(j)
		at := bytes.Index(out[off:], got)
		if len(got) == 0 || at < 0 {
			t.Fatalf("interval %d: journal holds %d bytes of stdout, not a run of the file after offset %d", i+1, len(got), off)
		}
		// Interval 1's first line is the unit's first; interval 2's, the
		// first after the park.
		first := ls[0]
		if i == 1 {
			first = ls[slices.IndexFunc(ls, func(l line) bool { return l.Counter > atParks[0].Counter })]
		}
		covers = append(covers, cover{start: body.StartNS, firstLine: first.Time, prevEnd: prevEnd, gap: out[off : off+at]})
		prevEnd = body.EndNS
		off += at + len(got)
		if body.StartNS >= body.EndNS || body.Interval != uint64(i+1) {
			t.Fatalf("interval %d: attestation %+v", i+1, body)
		}
		if !lifecycleEntry(j, "checkpointed", nil) {
			t.Fatalf("interval %d: no checkpointed entry in its journal", i+1)
		}
		if i == 1 {
			var idleEntry struct {
				UJ         uint64 `json:"uj"`
				Provenance string `json:"provenance"`
			}
			if !lifecycleEntry(j, "restored", nil) || !lifecycleEntry(j, "idle", &idleEntry) ||
				idleEntry.UJ != resumes[0].Idle.UJ || idleEntry.Provenance != "estimated" {
				t.Fatalf("interval 2's journal: restored and idle entries; idle %+v, the resume recorded %+v", idleEntry, resumes[0].Idle)
			}
		}
	}
	// Together the journals hold all of it: each interval is attested from
	// before the first line it holds, and no output falls between two.
	t.Run("JournalsCoverOutput", func(t *testing.T) {
		for i, c := range covers {
			if !stampedWithin(c.firstLine, c.start, c.prevEnd) || len(c.gap) > 0 {
				t.Errorf("interval %d: attested from %v, its first line written at %v; output in no interval's journal before it: %q",
					i+1, time.Unix(0, c.start).UTC().Format(time.StampMicro), time.Unix(0, c.firstLine).UTC().Format(time.StampMicro), c.gap)
			}
		}
	})
}

// TestIdleEnergy parks the oracle for three seconds: the Resumed segment
// carries idle energy labelled estimated (this host cannot attribute disk
// draw), equal to retained bytes × the storage coefficient × the parked
// time the daemon measured — which lies within what the test measured
// around it — and the next interval's journal records it with its inputs.
func TestIdleEnergy(t *testing.T) {
	privileged(t)
	d := shared(t)
	ctx := context.Background()
	const id = "idle"
	startOracle(t, d, id, oracleImage)

	parkSent := time.Now()
	p, atPark := park(t, d, id)
	parked := time.Now()
	time.Sleep(3 * time.Second)
	resumeSent := time.Now()
	r := resume(t, d, id, nil, atPark)
	resumed := time.Now()

	in := r.Idle.Inputs
	if r.Idle.Provenance != "estimated" || in["method"] != "retained-bytes-coefficient" || in["retained_bytes"] != strconv.FormatInt(p.Retained, 10) {
		t.Fatalf("idle %+v; the park retained %d bytes", r.Idle, p.Retained)
	}
	ns, err := strconv.ParseInt(in["parked_ns"], 10, 64)
	if err != nil {
		t.Fatalf("parked_ns %q: %v", in["parked_ns"], err)
	}
	// The daemon's park began before Park answered and ended after Resume
	// was sent.
	if lo, hi := resumeSent.Sub(parked), resumed.Sub(parkSent); time.Duration(ns) < lo || time.Duration(ns) > hi {
		t.Fatalf("the daemon measured %v parked; the test, between %v and %v", time.Duration(ns), lo, hi)
	}
	// uj = ⌈retained × W/TB / 10¹² × parked s × 10⁶⌉ = ⌈bytes × ns × W / 10¹⁵⌉
	w, ok := new(big.Rat).SetString(in["storage_watts_per_tb"])
	if !ok || w.Sign() <= 0 {
		t.Fatalf("storage coefficient %q", in["storage_watts_per_tb"])
	}
	want := new(big.Rat).SetInt64(p.Retained)
	want.Mul(want, new(big.Rat).SetInt64(ns))
	want.Mul(want, w)
	want.Quo(want, new(big.Rat).SetInt64(1e15))
	q, m := new(big.Int).QuoRem(want.Num(), want.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsUint64() || q.Uint64() != r.Idle.UJ || r.Idle.UJ == 0 {
		t.Fatalf("idle %d µJ; %d B × %s W/TB × %v = %s µJ", r.Idle.UJ, p.Retained, in["storage_watts_per_tb"], time.Duration(ns), q)
	}
	t.Logf("idle: %d B × %s W/TB × %v = %d µJ, estimated", p.Retained, in["storage_watts_per_tb"], time.Duration(ns), r.Idle.UJ)

	// Close it: the interval that began with the resume is attested, and
	// its journal holds the idle figure with its inputs.
	if _, err := d.c.Close(ctx, id, "e2e: idle energy checked"); err != nil {
		t.Fatal(err)
	}
	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), "executed suspended resumed executed closed"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	if re := s.Segments[2]; re.Idle == nil || re.Idle.UJ != r.Idle.UJ || re.Idle.Provenance != "estimated" {
		t.Fatalf("resumed segment %+v", re)
	}
	var entry struct {
		UJ         uint64            `json:"uj"`
		Provenance string            `json:"provenance"`
		Inputs     map[string]string `json:"inputs"`
		Retained   int64             `json:"retained_bytes"`
		ParkedNS   int64             `json:"parked_ns"`
	}
	_, j := d.journal(t, s.Segments[3])
	if !lifecycleEntry(j, "idle", &entry) || entry.UJ != r.Idle.UJ || entry.Provenance != "estimated" ||
		entry.Retained != p.Retained || entry.Inputs["parked_ns"] != in["parked_ns"] || entry.ParkedNS != r.ParkedNS {
		t.Fatalf("journal's idle entry %+v; the resume reported %+v, parked %d ns", entry, r.Idle, r.ParkedNS)
	}
	if s.Totals.IdleUJ != r.Idle.UJ || s.Totals.CostUJ != s.Totals.ActiveUJ+s.Totals.IdleUJ {
		t.Fatalf("totals %+v", s.Totals)
	}
}
