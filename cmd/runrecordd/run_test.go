package main

import (
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// runRequest parses run's command line into the request it sends.
func runRequest(t *testing.T, args ...string) (unit.Grants, error) {
	t.Helper()
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var f runFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	req, err := f.request(fs.Args())
	return req.Grants, err
}

func TestRunPodmanSpellings(t *testing.T) {
	for _, c := range []struct {
		args []string
		cpu  uint32
		mem  uint64
	}{
		{[]string{"--cpus", "1.5", "--memory", "512m", "img"}, 1500, 512 << 20},
		{[]string{"--cpus", "0.25", "--memory", "512Mi", "img"}, 250, 512 << 20},
		{[]string{"--cpu", "750", "--memory", "1g", "img"}, 750, 1 << 30},
		{[]string{"--memory", "1G", "img"}, 0, 1e9},
		{[]string{"--memory", "64k", "img"}, 0, 64 << 10},
		{[]string{"img"}, 0, 0},
	} {
		g, err := runRequest(t, c.args...)
		if err != nil || g.MilliCPU != c.cpu || g.MemoryBytes != c.mem {
			t.Errorf("%q: cpu %d memory %d (%v), want %d and %d", c.args, g.MilliCPU, g.MemoryBytes, err, c.cpu, c.mem)
		}
	}
	for _, bad := range [][]string{
		{"--cpus", "0", "img"}, {"--cpus", "-1", "img"}, {"--cpus", "1.0005", "img"}, {"--cpus", "x", "img"},
		{"--cpus", "1", "--cpu", "1000", "img"}, {"--memory", "5T", "img"}, {"--memory", "99999999999g", "img"},
	} {
		if _, err := runRequest(t, bad...); err == nil {
			t.Errorf("%q: taken", bad)
		}
	}
}

// run takes every limit of the grant set; a limit not given is zero, the
// daemon's default.
func TestRunLimits(t *testing.T) {
	g, err := runRequest(t, "--pids", "64", "--log-bytes", "1m", "--transcript-bytes", "2Mi", "--channel-conns", "3",
		"--channel-inflight-bytes", "4096", "--interval-calls", "10", "--interval-payload-bytes", "1M", "--snapshot-bytes", "1g", "img", "a")
	if err != nil {
		t.Fatal(err)
	}
	want := unit.Limits{Pids: 64, LogBytes: 1 << 20, TranscriptBytes: 2 << 20, ChannelConns: 3, ChannelInflightBytes: 4096,
		IntervalCalls: 10, IntervalPayloadBytes: 1e6, SnapshotBytes: 1 << 30}
	if !reflect.DeepEqual(g.Limits, want) {
		t.Errorf("limits %+v, want %+v", g.Limits, want)
	}
	if g, err = runRequest(t, "img"); err != nil || !g.Limits.IsZero() {
		t.Errorf("no limit flags: %+v %v", g.Limits, err)
	}
	for _, bad := range [][]string{{"--pids", "4294967296", "img"}, {"--log-bytes", "lots", "img"}} {
		if _, err := runRequest(t, bad...); err == nil {
			t.Errorf("%q: taken", bad)
		}
	}
}

func TestRunTableAgeParked(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return now.Add(-d) }
	runs := []api.Run{
		{ID: "exec", Status: "running", Started: at(42*time.Second + 900*time.Millisecond), Segments: 0, Image: "img", Head: "h1"},
		{ID: "parked", Status: "parked (image)", Started: at(3*time.Hour + 4*time.Minute), ParkedAt: at(3*time.Minute + 7*time.Second),
			Segments: 2, Image: "img", Head: "h2"},
		{ID: "old", Status: "parked (transcript)", Started: at(12*24*time.Hour + 5*time.Hour), ParkedAt: at(-time.Minute), Segments: 2, Head: "h3"},
		{ID: "lost", Status: "lost", Segments: 0, Head: "h4"},
	}
	var b strings.Builder
	runTableAt(&b, runs, now)
	want := "RUN\tSTATUS\tAGE\tPARKED\tSEGMENTS\tIMAGE\tHEAD\n" +
		"exec\trunning\t42s\t\t0\timg\th1\n" +
		"parked\tparked (image)\t3h04m\t3m07s\t2\timg\th2\n" +
		"old\tparked (transcript)\t12d05h\t0s\t2\t\th3\n" +
		"lost\tlost\t\t\t0\t\th4\n"
	if got := b.String(); got != want {
		t.Errorf("runTableAt:\n%q\nwant\n%q", got, want)
	}
}
