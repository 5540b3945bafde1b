//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// line is the oracle's report (units/oracle).
type line struct {
	Counter    uint64 `json:"counter"`
	Checksum   string `json:"checksum"`
	Verify     string `json:"verify"`
	VerifiedAt uint64 `json:"verified_at"`
	FileOffset int64  `json:"file_offset"`
	FileOK     bool   `json:"file_ok"`
	PipeSeq    uint64 `json:"pipe_seq"`
	LoUp       bool   `json:"lo_up"`
	Secret     string `json:"secret"`
	SecretErr  string `json:"secret_err"`
	Pid        int    `json:"pid"`
	ChildPid   int    `json:"child_pid"`
	BufAddr    uint64 `json:"buf_addr"` // with FORK_ON_USR2=1
	StartTime  int64  `json:"start_time"`
	Time       int64  `json:"time"`
	Error      string `json:"error"`
}

func last(ls []line) line { return ls[len(ls)-1] }

// oracleEnv: the 64 MiB buffer, verified every half second.
var oracleEnv = []string{"SIZE_MB=64", "VERIFY_EVERY=5"}

// closeAtEnd has the test's cleanup verify run id from genesis, close it
// if it is open and verify it again, while its daemon runs.
func closeAtEnd(t *testing.T, d *daemon, id string) {
	ctx := context.Background()
	t.Cleanup(func() {
		if !d.running() {
			return
		}
		if err := verifyRun(ctx, d, id); err != nil {
			t.Error(err)
		}
		s, err := d.run(ctx, id)
		// A run handed off by an export lives on another host: this one
		// refuses to close it (and the test that exported it checked so).
		if err == nil && s.Phase != "closed" && !s.HandedOff {
			_, err = d.c.Close(ctx, id, "e2e: test over")
			// In a fleet, a run held here parked may be another host's
			// to close (closeAll says the same).
			var ae *api.Error
			if d.fleet && s.Phase == "parked" && errors.As(err, &ae) && ae.Code == api.CodeNotOwner {
				err = nil
			}
		}
		if err != nil {
			t.Errorf("closing %s: %v", id, err)
			return
		}
		if err := verifyRun(ctx, d, id); err != nil {
			t.Error(err)
		}
	})
}

// startOracle starts the oracle as run id on d from image (imported under
// that name) and waits for its first verified line. The cleanup verifies
// the run from genesis and closes it (when the daemon is up; a daemon's
// own cleanup catches the rest).
func startOracle(t *testing.T, d *daemon, id, image string) api.Run {
	t.Helper()
	ctx := context.Background()
	r, err := d.c.Start(ctx, api.RunRequest{ID: id,
		Unit:   unit.Spec{Image: image, Env: oracleEnv},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork}})
	if err != nil {
		t.Fatalf("start %s on the %s daemon: %v", id, d.name, err)
	}
	closeAtEnd(t, d, id)
	if r.ID != id || r.Phase != "executing" || r.Status != "running" || r.Segments != 0 {
		t.Fatalf("started %+v", r)
	}
	waitLines(t, d.stdout(id), "the oracle's first verified line", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > 0
	})
	return r
}

// stdout is the file a run's unit output goes to on this daemon's host.
func (d *daemon) stdout(id string) string { return filepath.Join(d.state, "runs", id, "stdout") }

// output reads the complete lines of the oracle's stdout file; a line
// reporting a broken invariant fails the test.
func output(t *testing.T, path string) []line {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	// Only whole lines: the last one may be half-written.
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var out []line
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s: oracle line %q: %v", path, sc.Bytes(), err)
		}
		if l.Error != "" {
			t.Fatalf("%s: the oracle reports a broken invariant: %s", path, l.Error)
		}
		out = append(out, l)
	}
	return out
}

// waitLines waits until the oracle's stdout holds lines satisfying ok, and
// returns them.
func waitLines(t *testing.T, path, what string, ok func([]line) bool) []line {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ls := output(t, path)
		if ok(ls) {
			return ls
		}
		if time.Now().After(deadline) {
			stderr, _ := os.ReadFile(filepath.Join(filepath.Dir(path), "stderr"))
			t.Fatalf("waiting for %s in %s: %d lines; stderr: %s", what, path, len(ls), stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkOneProcess checks that lines (every incarnation's output, in order)
// are one run of one process: counters 1, 2, 3 … with no gap and no
// repeat, one start time, one pair of pids, one buffer checksum recomputed
// and found equal, the file and the pipe where the counter says.
func checkOneProcess(t *testing.T, ls []line) {
	t.Helper()
	if len(ls) == 0 {
		t.Fatal("no oracle lines")
	}
	first := ls[0]
	if first.Checksum == "" || first.Pid != 1 {
		t.Fatalf("first line %+v", first)
	}
	for i, l := range ls {
		if l.Counter != uint64(i+1) || l.Checksum != first.Checksum || l.Verify != first.Checksum || !l.FileOK ||
			l.StartTime != first.StartTime || l.Pid != first.Pid || l.ChildPid != first.ChildPid ||
			l.FileOffset != 4096+8*int64(l.Counter) || l.PipeSeq != l.Counter-1 || l.VerifiedAt > l.Counter {
			t.Fatalf("line %d of one process: %+v; its first line %+v", i, l, first)
		}
	}
}

// park parks run id and returns the result and the last line the oracle
// wrote before it was frozen (the sandbox is gone when Park returns, and
// its output drained).
func park(t *testing.T, d *daemon, id string) (api.Park, line) {
	t.Helper()
	before, err := d.run(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.c.Park(context.Background(), id)
	if err != nil {
		t.Fatalf("park %s: %v", id, err)
	}
	if p.Run.Phase != "parked" || p.Run.Status != "parked (image)" || p.Run.Segments != before.Segments+2 {
		t.Fatalf("parked %+v; before %+v", p.Run, before)
	}
	cp := p.Checkpoint
	if cp == nil || cp.Pages < 64<<20/4096 || cp.ImageBytes < 64<<20 || cp.RootBytes == 0 || p.Retained < cp.ImageBytes {
		t.Fatalf("park %s: checkpoint %+v, retained %d: want the 64 MiB buffer and the rw layer", id, cp, p.Retained)
	}
	t.Logf("park %s: %v (CRIU frozen %v, memdump %v, memwrite %v; ingest %v), %d pages, retained %d B",
		id, time.Duration(p.DurationNS), time.Duration(cp.FrozenNS), time.Duration(cp.MemDumpNS), time.Duration(cp.MemWriteNS),
		time.Duration(cp.IngestNS), cp.Pages, p.Retained)
	ls := output(t, d.stdout(id))
	return p, last(ls)
}

// resume resumes run id on d and waits until the oracle, restored, has
// recomputed its buffer's checksum. prior is the output of the run's
// earlier incarnations on other hosts (nil on one host) and atPark the
// last line before the park. It checks that the process went on from where
// it was rather than starting again.
func resume(t *testing.T, d *daemon, id string, prior []line, atPark line) api.Resume {
	t.Helper()
	r, err := d.c.Resume(context.Background(), id)
	if err != nil {
		t.Fatalf("resume %s on the %s daemon: %v", id, d.name, err)
	}
	return resumed(t, d, id, r, prior, atPark)
}

// resumed checks resume r of run id on d as resume does.
func resumed(t *testing.T, d *daemon, id string, r api.Resume, prior []line, atPark line) api.Resume {
	t.Helper()
	if r.Run.Phase != "executing" || r.Run.Status != "running" {
		t.Fatalf("resumed %+v", r.Run)
	}
	if r.Idle.UJ == 0 || r.Idle.Provenance != "estimated" || r.ParkedNS <= 0 || r.Restore == nil {
		t.Fatalf("resume %s: idle %+v, parked %d ns, restore %+v", id, r.Idle, r.ParkedNS, r.Restore)
	}
	t.Logf("resume %s: %v (materialize %v, CRIU restore %v), %d pages; idle %d µJ %s over %v",
		id, time.Duration(r.DurationNS), time.Duration(r.Restore.MaterializeNS), time.Duration(r.Restore.RestoreNS),
		r.Restore.Pages, r.Idle.UJ, r.Idle.Provenance, time.Duration(r.ParkedNS))
	ls := waitLines(t, d.stdout(id), "a line verified after the resume", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > atPark.Counter
	})
	all := append(append([]line(nil), prior...), ls...)
	checkOneProcess(t, all)
	var after line
	for _, l := range all {
		if l.Counter > atPark.Counter {
			after = l
			break
		}
	}
	// Spelled out, though checkOneProcess implies it: not restarted.
	if after.Counter != atPark.Counter+1 || after.StartTime != atPark.StartTime || after.Pid != atPark.Pid ||
		after.ChildPid != atPark.ChildPid || after.Checksum != atPark.Checksum {
		t.Fatalf("first line after the resume %+v; last before the park %+v", after, atPark)
	}
	return r
}

// objectPath is where d's store keeps the object at addr (store.Path).
func (d *daemon) objectPath(addr string) string {
	text := strings.TrimPrefix(addr, record.AddressPrefix)
	return filepath.Join(d.state, "store", "objects", text[:1], text)
}

// object reads an object from d's store and checks it against its address.
func (d *daemon) object(t *testing.T, addr string) []byte {
	t.Helper()
	a, err := record.ParseAddress(addr)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(d.objectPath(addr))
	if err != nil {
		t.Fatal(err)
	}
	if record.Sum(b) != a {
		t.Fatalf("object %s hashes to %s", addr, record.Sum(b))
	}
	return b
}

// journal returns the attestation body and replay journal an Executed
// segment names.
func (d *daemon) journal(t *testing.T, seg api.Segment) (*attest.Body, *attest.Journal) {
	t.Helper()
	body, err := attest.Open(d.object(t, seg.Attestation), nil)
	if err != nil {
		t.Fatalf("segment %d: attestation: %v", seg.Index, err)
	}
	j, err := attest.DecodeJournal(d.object(t, body.Journal.String()))
	if err != nil {
		t.Fatalf("segment %d: journal: %v", seg.Index, err)
	}
	return body, j
}

// lifecycleEntry finds the journal's lifecycle entry for event, and
// decodes its JSON detail into v (when not nil).
func lifecycleEntry(j *attest.Journal, event string, v any) bool {
	for _, e := range j.Entries {
		if e.Kind != attest.Lifecycle {
			continue
		}
		name, detail, _ := bytes.Cut(e.Data, []byte(" "))
		if string(name) != event {
			continue
		}
		if v != nil && json.Unmarshal(detail, v) != nil {
			return false
		}
		return true
	}
	return false
}

// stdoutOf is the unit output an interval's journal holds.
func stdoutOf(j *attest.Journal) []byte {
	var b []byte
	for _, e := range j.Entries {
		if e.Kind == attest.Stdout {
			b = append(b, e.Data...)
		}
	}
	return b
}

// snapshotAddrs splits a snapshot's text ("image root A memory B").
func snapshotAddrs(t *testing.T, s string) (root, memory string) {
	t.Helper()
	f := strings.Fields(s)
	if len(f) != 5 || f[0] != "image" || f[1] != "root" || f[3] != "memory" {
		t.Fatalf("snapshot %q: not an image park with a memory image", s)
	}
	return f[2], f[4]
}

// unchanged checks that a refused operation left run id as it was.
func unchanged(t *testing.T, d *daemon, id string, was api.Run) {
	t.Helper()
	now, err := d.run(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if now != was {
		t.Fatalf("a refusal changed the run: %+v, was %+v", now, was)
	}
}

// handedOff checks that run id, exported from d, is handed off: its record
// is as it was exported (was), nothing on d resumes or closes it.
func handedOff(t *testing.T, d *daemon, id string, was api.Run) {
	t.Helper()
	ctx := context.Background()
	now, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := was
	want.HandedOff, want.Status = true, "handed off"
	if now != want {
		t.Fatalf("exported run on the %s daemon: %+v, want %+v", d.name, now, want)
	}
	_, err = d.c.Resume(ctx, id)
	apiError(t, err, api.CodeHandedOff)
	_, err = d.c.Close(ctx, id, "e2e: closing a handed-off run")
	apiError(t, err, api.CodeHandedOff)
	if now, err = d.run(ctx, id); err != nil || now != want {
		t.Fatalf("a refused resume or close changed the handed-off run: %+v (%v), want %+v", now, err, want)
	}
}

// apiError checks that err is an *api.Error with code.
func apiError(t *testing.T, err error, code string) *api.Error {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("got %v (%T), want an api.Error with code %s", err, err, code)
	}
	return ae
}

func mustShow(t *testing.T, d *daemon, id string) api.Show {
	t.Helper()
	s, err := d.c.Show(context.Background(), id)
	if err != nil {
		t.Fatalf("show %s: %v", id, err)
	}
	return s
}

func kinds(segs []api.Segment) string {
	var k []string
	for _, s := range segs {
		k = append(k, s.Kind)
	}
	return strings.Join(k, " ")
}

func fmtSegments(segs []api.Segment) string {
	var b strings.Builder
	for _, s := range segs {
		fmt.Fprintf(&b, "\n  %d %s %s", s.Index, s.Kind, s.Head)
	}
	return b.String()
}
