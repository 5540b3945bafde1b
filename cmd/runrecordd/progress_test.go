package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

func TestProgressLine(t *testing.T) {
	p := &progress{label: "import run.bundle", total: 40 << 20, bytes: true}
	p.Add(10 << 20)
	if got, want := p.line(2*time.Second, false), "import run.bundle: 10.0 MiB of 40.0 MiB (25%), 5.0 MiB/s, 6s left"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	p.Add(30 << 20)
	if got, want := p.line(8*time.Second, true), "import run.bundle: 40.0 MiB in 8s, 5.0 MiB/s"; got != want {
		t.Errorf("final %q, want %q", got, want)
	}
	// An export's size is not known ahead: no share, no time left.
	e := &progress{label: "export o1", bytes: true}
	e.Add(3 << 20)
	if got, want := e.line(time.Second, false), "export o1: 3.0 MiB, 3.0 MiB/s"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	// A park's bytes are the daemon's: the time so far.
	k := &progress{label: "park o1"}
	if got, want := k.line(2300*time.Millisecond, false), "park o1: 2s so far"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	if got, want := k.line(2300*time.Millisecond, true), "park o1: done in 2.3s"; got != want {
		t.Errorf("final %q, want %q", got, want)
	}
}

// --progress prints the end whatever the time taken; off, nothing is
// printed and the bytes go through untouched.
func TestProgressReport(t *testing.T) {
	var out bytes.Buffer
	p := &progress{w: &out, label: "export o1", bytes: true, eager: true, start: time.Now(),
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
	var off *progress = startProgress(progressFlag{set: true, on: false}, "export o1", 0, true)
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
	var f progressFlag
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f.register(fs)
	if f.String() != "auto" {
		t.Errorf("default %q", f.String())
	}
	if err := fs.Parse([]string{"--progress"}); err != nil || !f.set || !f.on {
		t.Errorf("--progress: %+v %v", f, err)
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
