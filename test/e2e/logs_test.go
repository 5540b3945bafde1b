//go:build linux

package e2e

// A run's output read back across parks and resumes (GET
// /v1/runs/{id}/logs, internal/runlog), end to end:
//
//   - TestLogsImagePark: the oracle writes, is image-parked and resumed,
//     writes more; logs returns every line once, in order, interval 1's
//     before interval 2's, the counters going on without a gap; --tail 1
//     is the last line; a follow begun at the start prints the same bytes
//     and ends when the run is closed.
//   - TestLogsTranscriptMigrated: the agent is transcript-parked and
//     resumed on host A, parked again and moved to host B in a bundle,
//     and finishes there. On B, logs returns its three intervals in order,
//     the first two from the journals A sealed; each interval's hello names
//     the interval its label says. A's follow ends at the handoff, B's at
//     the close.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// logsOf is run id's output on d, whole.
func logsOf(t *testing.T, d *daemon, id string, o api.LogOptions) []api.LogLine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []api.LogLine
	if err := d.c.Logs(ctx, id, o, func(l api.LogLine) bool { out = append(out, l); return true }); err != nil {
		t.Fatalf("logs %s on the %s daemon: %v", id, d.name, err)
	}
	return out
}

// logKey is an interval's stream.
type logKey struct {
	interval uint64
	stream   string
}

// streams are ls's bytes by interval and stream, and the order the
// intervals come in; a line out of interval order fails the test.
func streams(t *testing.T, ls []api.LogLine) (map[logKey][]byte, []uint64) {
	t.Helper()
	out := map[logKey][]byte{}
	var order []uint64
	for i, l := range ls {
		if l.Reason != "" {
			t.Fatalf("line %d marks output left out: %+v", i, l)
		}
		if l.Interval == 0 || (l.Stream != "stdout" && l.Stream != "stderr") {
			t.Fatalf("line %d: %+v", i, l)
		}
		if n := len(order); n == 0 || order[n-1] != l.Interval {
			if n > 0 && order[n-1] > l.Interval {
				t.Fatalf("line %d of interval %d comes after interval %d's", i, l.Interval, order[n-1])
			}
			order = append(order, l.Interval)
		}
		k := logKey{l.Interval, l.Stream}
		out[k] = append(out[k], l.Data()...)
	}
	return out, order
}

// follow follows run id's output on d from its start; the function it
// returns waits up to 30 s for the follow to end by itself.
func follow(t *testing.T, d *daemon, id string) func() []api.LogLine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	type result struct {
		ls  []api.LogLine
		err error
	}
	done := make(chan result, 1)
	go func() {
		var ls []api.LogLine
		err := d.c.Logs(ctx, id, api.LogOptions{Follow: true, Tail: api.TailAll}, func(l api.LogLine) bool {
			ls = append(ls, l)
			return true
		})
		done <- result{ls, err}
	}()
	return func() []api.LogLine {
		t.Helper()
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("follow %s on the %s daemon: %v", id, d.name, r.err)
			}
			return r.ls
		case <-time.After(30 * time.Second):
			cancel()
			t.Fatalf("follow %s on the %s daemon did not end", id, d.name)
			return nil
		}
	}
}

// oracleLines are the oracle's reports in b.
func oracleLines(t *testing.T, b []byte) []line {
	t.Helper()
	var out []line
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("oracle line %q: %v", sc.Bytes(), err)
		}
		out = append(out, l)
	}
	return out
}

func TestLogsImagePark(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := shared(t)
	const id = "logs-image"
	startOracle(t, d, id, oracleImage)
	followed := follow(t, d, id)

	_, atPark := park(t, d, id)
	parked, order := streams(t, logsOf(t, d, id, api.LogOptions{Tail: api.TailAll}))
	ls := oracleLines(t, parked[logKey{1, "stdout"}])
	if fmt.Sprint(order) != "[1]" || len(ls) == 0 || last(ls) != atPark {
		t.Fatalf("parked: intervals %v, %d lines, the last %+v; the oracle's last before the park %+v", order, len(ls), ls, atPark)
	}
	checkOneProcess(t, ls)

	resume(t, d, id, nil, atPark)
	all, order := streams(t, logsOf(t, d, id, api.LogOptions{Tail: api.TailAll}))
	if fmt.Sprint(order) != "[1 2]" || !bytes.Equal(all[logKey{1, "stdout"}], parked[logKey{1, "stdout"}]) {
		t.Fatalf("resumed: intervals %v; interval 1's output changed", order)
	}
	ls2 := oracleLines(t, all[logKey{2, "stdout"}])
	if len(ls2) == 0 || ls2[0].Counter != atPark.Counter+1 {
		t.Fatalf("interval 2 begins with %+v; the park was at counter %d", ls2, atPark.Counter)
	}
	checkOneProcess(t, append(ls, ls2...))

	tail := logsOf(t, d, id, api.LogOptions{Tail: 1})
	if len(tail) != 1 || tail[0].Interval != 2 || tail[0].Stream != "stdout" {
		t.Fatalf("--tail 1: %+v", tail)
	}
	if _, err := d.c.Close(ctx, id, "logs test"); err != nil {
		t.Fatal(err)
	}
	closed, order := streams(t, logsOf(t, d, id, api.LogOptions{Tail: api.TailAll}))
	got, _ := streams(t, followed())
	for _, k := range []logKey{{1, "stdout"}, {1, "stderr"}, {2, "stdout"}, {2, "stderr"}} {
		if !bytes.Equal(got[k], closed[k]) {
			t.Fatalf("interval %d %s: the follow printed %d bytes, logs after the close %d", k.interval, k.stream, len(got[k]), len(closed[k]))
		}
	}
	final := oracleLines(t, closed[logKey{2, "stdout"}])
	if fmt.Sprint(order) != "[1 2]" || len(final) < len(ls2) {
		t.Fatalf("closed: intervals %v, interval 2 has %d lines, %d before the close", order, len(final), len(ls2))
	}
	t.Logf("%d lines in interval 1, %d in interval 2; the follow printed them all and ended at the close", len(ls), len(final))
}

// agentHellos are the intervals the agent's hello lines in b name.
func agentHellos(t *testing.T, b []byte) []int64 {
	t.Helper()
	var out []int64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var l struct {
			Action   string `json:"action"`
			Interval int64  `json:"interval"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("agent line %q: %v", sc.Bytes(), err)
		}
		if l.Action == "hello" {
			out = append(out, l.Interval)
		}
	}
	return out
}

func TestLogsTranscriptMigrated(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := mustDaemon(t, "logs-a")
	mustImportImage(t, a, trAgentArchive, trAgentImage, trAgentDigest)
	const id = "logs-agent"
	trStart(t, a, id, trAgentImage, "STEPS=2")
	followA := follow(t, a, id)
	trParked(t, a, id, 2)
	trPost(t, a, id, "call-1", trResult(1))
	trParked(t, a, id, 5)
	onA, order := streams(t, logsOf(t, a, id, api.LogOptions{Tail: api.TailAll}))
	if fmt.Sprint(order) != "[1 2]" {
		t.Fatalf("on A: intervals %v", order)
	}

	var bundle bytes.Buffer
	if err := a.c.Export(ctx, id, &bundle); err != nil {
		t.Fatalf("export: %v", err)
	}
	// Handed off: A's follow is over, with all A had.
	gotA, _ := streams(t, followA())
	for k, b := range onA {
		if !bytes.Equal(gotA[k], b) {
			t.Fatalf("interval %d %s: A's follow printed %q, logs %q", k.interval, k.stream, gotA[k], b)
		}
	}

	b := mustDaemon(t, "logs-b")
	trustHost(t, a, b)
	if _, err := b.c.Import(ctx, bytes.NewReader(bundle.Bytes()), ""); err != nil {
		t.Fatalf("import: %v", err)
	}
	mustImportImage(t, b, trAgentArchive, trAgentImage, trAgentDigest)
	followB := follow(t, b, id)
	trPost(t, b, id, "call-2", trResult(2))
	trClosed(t, b, id)

	onB, order := streams(t, logsOf(t, b, id, api.LogOptions{Tail: api.TailAll}))
	if fmt.Sprint(order) != "[1 2 3]" {
		t.Fatalf("on B: intervals %v", order)
	}
	for k, want := range onA {
		if !bytes.Equal(onB[k], want) {
			t.Fatalf("interval %d %s on B %q; on A %q", k.interval, k.stream, onB[k], want)
		}
	}
	for n := uint64(1); n <= 3; n++ {
		if h := agentHellos(t, onB[logKey{n, "stdout"}]); len(h) != 1 || h[0] != int64(n) {
			t.Fatalf("interval %d's output says hello from intervals %v", n, h)
		}
	}
	if !bytes.Contains(onB[logKey{3, "stdout"}], []byte(`"action":"done"`)) {
		t.Fatalf("interval 3 on B: %q, want the agent's done", onB[logKey{3, "stdout"}])
	}
	gotB, _ := streams(t, followB())
	for k, want := range onB {
		if !bytes.Equal(gotB[k], want) {
			t.Fatalf("interval %d %s: B's follow printed %q, logs %q", k.interval, k.stream, gotB[k], want)
		}
	}
}
