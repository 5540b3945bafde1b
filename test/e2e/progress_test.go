//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// jsonlLine is a line of `-o jsonl`: a progress event, the result or the
// error.
type jsonlLine struct {
	Event      string          `json:"event"`
	Verb       string          `json:"verb"`
	Run        string          `json:"run"`
	File       string          `json:"file"`
	Bytes      *int64          `json:"bytes"`
	TotalBytes int64           `json:"total_bytes"`
	ElapsedNS  int64           `json:"elapsed_ns"`
	Final      bool            `json:"final"`
	Result     json.RawMessage `json:"result"`
	Code       string          `json:"code"`
	Exit       int             `json:"exit"`
}

// jsonl runs the CLI with args and -o jsonl, and returns its progress
// events and its last line, checking that every line is one JSON object,
// that only the last is a result or an error, and that the exit status is
// the one it expects.
func jsonl(t *testing.T, exit int, args ...string) (progress []jsonlLine, last jsonlLine) {
	t.Helper()
	cmd := exec.Command(daemonBinary, append(args, "-o", "jsonl")...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil && exit != 0, err != nil && !errors.As(err, &ee), ee != nil && ee.ExitCode() != exit:
		t.Fatalf("runrecordd %s: %v, want exit %d\nstdout %s\nstderr %s", strings.Join(args, " "), err, exit, stdout.String(), stderr.String())
	}
	var lines []jsonlLine
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var l jsonlLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("runrecordd %s: line %q: %v", strings.Join(args, " "), sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		t.Fatalf("runrecordd %s: no lines; stderr %s", strings.Join(args, " "), stderr.String())
	}
	progress, last = lines[:len(lines)-1], lines[len(lines)-1]
	for _, l := range progress {
		if l.Event != "progress" {
			t.Fatalf("runrecordd %s: %q before the last line", strings.Join(args, " "), l.Event)
		}
	}
	return progress, last
}

// checkBytes checks that progress events count bytes upwards, the last
// one final with want bytes, and each one's total is total.
func checkBytes(t *testing.T, verb string, progress []jsonlLine, want, total int64) {
	t.Helper()
	if len(progress) < 2 {
		t.Fatalf("%s: %d progress events, want one on the way and the final one", verb, len(progress))
	}
	var prev, prevNS int64
	for i, e := range progress {
		if e.Verb != verb || e.Bytes == nil || *e.Bytes < prev || e.ElapsedNS < prevNS || e.TotalBytes != total || e.Final != (i == len(progress)-1) {
			t.Fatalf("%s: event %d of %d: %+v after %d bytes", verb, i, len(progress), e, prev)
		}
		prev, prevNS = *e.Bytes, e.ElapsedNS
	}
	if prev != want {
		t.Errorf("%s: final event at %d bytes, want %d", verb, prev, want)
	}
	t.Logf("%s: %d progress events, %d bytes in %d ms", verb, len(progress), prev, prevNS/1e6)
}

// TestProgressEvents drives a parked oracle through the CLI with -o jsonl
// and --progress: the park's events count time, the export's and the
// import's count the bundle's bytes upwards to its size, and each verb's
// last line is what -o json prints. A verb that fails ends in an error
// event with the API's code and the exit status.
func TestProgressEvents(t *testing.T) {
	privileged(t)
	d := shared(t)
	const id = "progress"
	startOracle(t, d, id, oracleImage)
	flags := []string{"--socket", d.socket, "--progress", "--progress-every", "10ms"}

	progress, last := jsonl(t, 0, append([]string{"park", id}, flags...)...)
	var p api.Park
	if err := json.Unmarshal(last.Result, &p); last.Event != "result" || err != nil || p.Run.ID != id || p.Run.Phase != "parked" {
		t.Fatalf("park: last line %+v (%v)", last, err)
	}
	if len(progress) == 0 || !progress[len(progress)-1].Final {
		t.Fatalf("park: progress %+v: want the final event with --progress", progress)
	}
	for _, e := range progress {
		if e.Verb != "park" || e.Run != id || e.Bytes != nil {
			t.Fatalf("park: event %+v", e)
		}
	}

	bundle := filepath.Join(t.TempDir(), "progress.bundle")
	progress, last = jsonl(t, 0, append([]string{"export", id, "-f", bundle}, flags...)...)
	fi, err := os.Stat(bundle)
	if err != nil || fi.Size() < 64<<20 {
		t.Fatalf("bundle: %v, %v: want the 64 MiB memory image in it", fi, err)
	}
	var ex struct {
		Run       string `json:"run"`
		File      string `json:"file"`
		Bytes     int64  `json:"bytes"`
		HandedOff bool   `json:"handed_off"`
	}
	if err := json.Unmarshal(last.Result, &ex); last.Event != "result" || err != nil || ex.Run != id || ex.File != bundle || ex.Bytes != fi.Size() || !ex.HandedOff {
		t.Fatalf("export: last line %+v, %+v (%v)", last, ex, err)
	}
	checkBytes(t, "export", progress, fi.Size(), 0)

	// Back here with the very bundle: its size is known ahead.
	progress, last = jsonl(t, 0, append([]string{"import", "--reclaim", bundle}, flags...)...)
	var im api.Import
	if err := json.Unmarshal(last.Result, &im); last.Event != "result" || err != nil || im.Run.ID != id || im.Run.HandedOff {
		t.Fatalf("import: last line %+v (%v)", last, err)
	}
	checkBytes(t, "import", progress, fi.Size(), fi.Size())

	// Failures: the last line is the error.
	_, last = jsonl(t, 4, append([]string{"export", "nosuch", "-f", bundle + ".no"}, flags...)...)
	if last.Event != "error" || last.Code != api.CodeNotFound || last.Exit != 4 {
		t.Errorf("export of no run: last line %+v", last)
	}
	if _, err := os.Stat(bundle + ".no"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed export left %s: %v", bundle+".no", err)
	}
	_, last = jsonl(t, 5, append([]string{"import", bundle}, flags...)...)
	if last.Event != "error" || last.Code != api.CodeExists || last.Exit != 5 {
		t.Errorf("import of a run held: last line %+v", last)
	}
}
