package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

func TestProgressLine(t *testing.T) {
	p := &progress{of: progressEvent{Verb: "import", File: "run.bundle"}, total: 40 << 20, bytes: true}
	p.Add(10 << 20)
	if got, want := p.event(2*time.Second, false).line(), "import run.bundle: 10.0 MiB of 40.0 MiB (25%), 5.0 MiB/s, 6s left"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	p.Add(30 << 20)
	if got, want := p.event(8*time.Second, true).line(), "import run.bundle: 40.0 MiB in 8s, 5.0 MiB/s"; got != want {
		t.Errorf("final %q, want %q", got, want)
	}
	// An export's size is not known ahead: no share, no time left.
	e := &progress{of: progressEvent{Verb: "export", Run: "o1"}, bytes: true}
	e.Add(3 << 20)
	if got, want := e.event(time.Second, false).line(), "export o1: 3.0 MiB, 3.0 MiB/s"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	// A park's bytes are the daemon's: the time so far.
	k := &progress{of: progressEvent{Verb: "park", Run: "o1"}}
	if got, want := k.event(2300*time.Millisecond, false).line(), "park o1: 2s so far"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	if got, want := k.event(2300*time.Millisecond, true).line(), "park o1: done in 2.3s"; got != want {
		t.Errorf("final %q, want %q", got, want)
	}
	// A run id is the daemon's, a file name the operator's: neither
	// drives the terminal.
	x := &progress{of: progressEvent{Verb: "park", Run: "o\x1b[2J"}}
	if got, want := x.event(time.Second, false).line(), `park o\u001b[2J: 1s so far`; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
}

// The same figures as events: bytes present (0 too) when counted, absent
// for a park; total, rate and time left as known.
func TestProgressEvent(t *testing.T) {
	p := &progress{of: progressEvent{Verb: "import", File: "run.bundle"}, total: 40 << 20, bytes: true}
	if got, want := mustJSON(t, p.event(0, false)), `{"event":"progress","verb":"import","file":"run.bundle","bytes":0,"total_bytes":41943040,"elapsed_ns":0}`; got != want {
		t.Errorf("at 0: %s\nwant %s", got, want)
	}
	p.Add(10 << 20)
	if got, want := mustJSON(t, p.event(2*time.Second, false)), `{"event":"progress","verb":"import","file":"run.bundle","bytes":10485760,"total_bytes":41943040,"bytes_per_second":5242880,"elapsed_ns":2000000000,"left_ns":6000000000}`; got != want {
		t.Errorf("at 2s: %s\nwant %s", got, want)
	}
	k := &progress{of: progressEvent{Verb: "park", Run: "o1"}}
	if got, want := mustJSON(t, k.event(time.Second, true)), `{"event":"progress","verb":"park","run":"o1","elapsed_ns":1000000000,"final":true}`; got != want {
		t.Errorf("park: %s\nwant %s", got, want)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// --progress prints the end whatever the time taken; off, nothing is
// printed and the bytes go through untouched.
func TestProgressReport(t *testing.T) {
	var out bytes.Buffer
	p := &progress{w: &out, of: progressEvent{Verb: "export", Run: "o1"}, bytes: true, eager: true, every: progressLogEvery, start: time.Now(),
		stop: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	var dst bytes.Buffer
	if _, err := io.Copy(p.Writer(&dst), strings.NewReader("bundle bytes")); err != nil {
		t.Fatal(err)
	}
	p.Done(errors.New("cut"))
	if dst.String() != "bundle bytes" || !strings.HasPrefix(out.String(), "export o1: 12 B in ") || !strings.HasSuffix(out.String(), ", failed\n") {
		t.Errorf("wrote %q, reported %q", dst.String(), out.String())
	}
	v := newVerb("export")
	v.withProgress(io.Discard)
	if err := v.fs.Parse([]string{"--progress=false", "-o", "jsonl"}); err != nil {
		t.Fatal(err)
	}
	off := v.startProgress(progressEvent{Verb: "export", Run: "o1"}, 0, true)
	if off != nil {
		t.Fatal("--progress=false reports")
	}
	dst.Reset()
	_, _ = io.Copy(off.Writer(&dst), strings.NewReader("x"))
	off.Done(nil)
	if dst.String() != "x" {
		t.Errorf("off: wrote %q", dst.String())
	}
	// The flag reads as a boolean, auto until given.
	var f progressFlags
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f.register(fs)
	if f.report.String() != "auto" {
		t.Errorf("default %q", f.report.String())
	}
	if err := fs.Parse([]string{"--progress", "--progress-every", "-1s"}); err != nil || !f.report.set || !f.report.on {
		t.Errorf("--progress: %+v %v", f, err)
	}
	if err := f.check(); err == nil {
		t.Error("--progress-every -1s taken")
	}
}

// With -o jsonl, progress is events on standard output: unasked, every
// --progress-every once the operation has taken a second, with a final
// one when any was written; none for a quick operation. Then the result.
func TestProgressEvents(t *testing.T) {
	var out bytes.Buffer
	v := newVerb("import")
	v.withProgress(&out)
	if err := v.fs.Parse([]string{"-o", "jsonl", "--progress-every", "1ms"}); err != nil {
		t.Fatal(err)
	}
	p := v.startProgress(progressEvent{Verb: "import", File: "b"}, 1000, true)
	if p == nil || p.events == nil || p.every != progressMinEvery || p.eager {
		t.Fatalf("progress %+v", p)
	}
	p.Add(10)
	p.Done(nil) // well under a second: nothing
	if out.Len() != 0 {
		t.Errorf("a quick import reported %q", out.String())
	}
	p = v.startProgress(progressEvent{Verb: "import", File: "b"}, 1000, true)
	p.Add(100)
	time.Sleep(progressDelay) // unasked, events begin after a second
	for range 4 {
		time.Sleep(3 * progressMinEvery)
		p.Add(100)
	}
	p.Done(nil)
	if err := v.cf.print(&out, map[string]int{"objects": 3}, nil); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) < 3 {
		t.Fatalf("%d lines: %q", len(lines), out.String())
	}
	var last int64
	for i, l := range lines[:len(lines)-1] {
		var e progressEvent
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Event != "progress" || e.Verb != "import" || e.File != "b" || e.Bytes == nil || *e.Bytes < last || e.TotalBytes != 1000 {
			t.Fatalf("line %d: %s (%v)", i, l, err)
		}
		last = *e.Bytes
		if final := i == len(lines)-2; e.Final != final {
			t.Errorf("line %d: final %v", i, e.Final)
		}
	}
	if last != 500 {
		t.Errorf("final bytes %d", last)
	}
	if got, want := lines[len(lines)-1], `{"event":"result","result":{"objects":3}}`; got != want {
		t.Errorf("result %s, want %s", got, want)
	}
}

// A failure with -o jsonl ends in an error event: the API's code and
// message, or bad_request for bad usage, and the exit status.
func TestErrorEvent(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&api.Error{Code: api.CodeNotFound, Message: "no such run: o9", Status: 404}, `{"event":"error","code":"not_found","error":"no such run: o9","exit":4}`},
		{fmt.Errorf("export: %w", &api.Error{Code: api.CodeManifestMismatch, Message: "differ", Keys: []string{"k"}}), `{"event":"error","code":"manifest_mismatch","error":"differ","keys":["k"],"exit":5}`},
		{usagef("usage: runrecordd migrate RUN --to KEY"), `{"event":"error","code":"bad_request","error":"usage: runrecordd migrate RUN --to KEY","exit":2}`},
		{errors.New("open b: no such file"), `{"event":"error","code":"","error":"open b: no such file","exit":1}`},
	} {
		if got := mustJSON(t, newErrorEvent(c.err)); got != c.want {
			t.Errorf("%v: %s\nwant %s", c.err, got, c.want)
		}
	}
}

// -o jsonl is for the verbs that stream; the others refuse it, naming
// them.
func TestJSONLOnlyWhereStreamed(t *testing.T) {
	var stdout bytes.Buffer
	for _, args := range [][]string{{"list", "-o", "jsonl"}, {"show", "x", "-o", "jsonl"}} {
		if code := run(append(args, "--socket", "/nonexistent"), &stdout, io.Discard); code != 2 {
			t.Errorf("%q: exit %d", args, code)
		}
	}
	// A streaming verb takes it: the failure to reach the daemon is an
	// error event, exit 3.
	if code := run([]string{"park", "x", "-o", "jsonl", "--socket", "/nonexistent"}, &stdout, io.Discard); code != 3 {
		t.Errorf("park -o jsonl: exit %d", code)
	}
	var e errorEvent
	if err := json.Unmarshal(stdout.Bytes(), &e); err != nil || e.Event != "error" || e.Code != api.CodeDaemonUnreachable || e.Exit != 3 {
		t.Errorf("park -o jsonl: %q, %v", stdout.String(), err)
	}
}

// drain -o json keeps each run's outcome: a JSON line per drain.run
// event, where -o table prints a line of text.
func TestDrainProgress(t *testing.T) {
	var js, tab bytes.Buffer
	for _, e := range []api.Event{{Kind: "run.parked", Run: "a"}, {Kind: "drain.run", Run: "b", Detail: "moved to b3:x"}} {
		(&drainProgress{w: &js, json: true}).event(e)
		(&drainProgress{w: &tab}).event(e)
	}
	if got := js.String(); !strings.Contains(got, `"kind":"drain.run"`) || !strings.Contains(got, `"run":"b"`) || strings.Count(got, "\n") != 1 {
		t.Errorf("json: %q", got)
	}
	if got := tab.String(); got != "b\tmoved to b3:x\n" {
		t.Errorf("table: %q", got)
	}
	// With -o jsonl, a progress event on standard output.
	var jl bytes.Buffer
	dp := &drainProgress{events: &eventLines{w: &jl}, start: time.Now()}
	dp.event(api.Event{Kind: "run.parked", Run: "a"})
	dp.event(api.Event{Kind: "drain.run", Run: "b", Detail: "moved to b3:x"})
	var e progressEvent
	if err := json.Unmarshal(jl.Bytes(), &e); err != nil || e.Event != "progress" || e.Verb != "drain" || e.Run != "b" || e.Detail != "moved to b3:x" || e.Bytes != nil {
		t.Errorf("jsonl: %q, %v", jl.String(), err)
	}
	// The drain waits for every run's line, and no longer than it says.
	p := &drainProgress{w: io.Discard, more: make(chan struct{}, 1)}
	go func() {
		for range 3 {
			p.event(api.Event{Kind: "drain.run", Run: "r"})
		}
	}()
	p.wait(3, 10*time.Second)
	if p.printed.Load() != 3 {
		t.Errorf("waited for %d lines of 3", p.printed.Load())
	}
	start := time.Now()
	p.wait(4, 100*time.Millisecond)
	if time.Since(start) > 5*time.Second {
		t.Error("wait outlived its bound")
	}
}
