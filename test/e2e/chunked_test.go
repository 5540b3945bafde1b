//go:build linux

package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/ociarchive"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ballastImage is the name units/ballast is imported under.
const ballastImage = "runrecordd.test/ballast:1"

// ballastLine is one line of units/ballast.
type ballastLine struct {
	Counter   uint64 `json:"counter"`
	Verified  uint64 `json:"verified_at"`
	Pid       int    `json:"pid"`
	StartTime int64  `json:"start_time"`
	Changes   uint64 `json:"changes"`
	Error     string `json:"error"`
}

// ballastLines reads the ballast's complete lines; a line reporting a
// page that lost its word fails the test.
func ballastLines(t *testing.T, path string) []ballastLine {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var out []ballastLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var l ballastLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s: ballast line %q: %v", path, sc.Bytes(), err)
		}
		if l.Error != "" {
			t.Fatalf("%s: the ballast reports %s", path, l.Error)
		}
		out = append(out, l)
	}
	return out
}

// waitBallast waits until the ballast's output holds a line ok accepts,
// and returns the lines up to it.
func waitBallast(t *testing.T, path, what string, ok func(ballastLine) bool) []ballastLine {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ls := ballastLines(t, path)
		for i, l := range ls {
			if ok(l) {
				return ls[:i+1]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s in %s: %d lines", what, path, len(ls))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ballastOnce checks that the lines are one process, going on: one start
// time and pid, counters increasing.
func ballastOnce(t *testing.T, ls []ballastLine) {
	t.Helper()
	for i, l := range ls {
		if l.StartTime != ls[0].StartTime || l.Pid != ls[0].Pid || (i > 0 && l.Counter < ls[i-1].Counter) {
			t.Fatalf("line %d %+v; the first %+v", i, l, ls[0])
		}
	}
}

// signalUnits sends sig to every process in d's sandbox cgroups: the one
// ballast this test runs on d.
func signalUnits(t *testing.T, d *daemon, sig syscall.Signal) {
	t.Helper()
	pids := map[int]bool{} // under cgroup v1, each hierarchy lists them
	for _, dir := range d.cgroupDirs() {
		filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids[pid] = true
				}
			}
			return nil
		})
	}
	if len(pids) != 1 {
		t.Fatalf("%d processes in the %s daemon's sandboxes, want the ballast alone", len(pids), d.name)
	}
	for pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatal(err)
		}
	}
}

// TestChunkedImages runs units/ballast (64 MiB of random pages) on a
// daemon with chunked images (the default): parks it, resumes it, has it change 1% of
// its pages, parks it again — and the second park adds to the store a
// small fraction of the image (the chunks that changed), not a second
// image. The unit goes on as one process after each resume, the record
// and every object verify, and a bundle of the run parked three times
// carries the shared chunks once: it is far smaller than three images. On
// a second daemon, with --chunked-images=false, the bundle imports, the
// run resumes from the chunks and parks whole. A second run of the unit
// stores only a small fraction of its first park: its kin's slabs hold
// the rest.
func TestChunkedImages(t *testing.T) {
	privileged(t)
	parallelCrash(t) // beside the fleet tests (parallel_test.go)
	ctx := context.Background()
	prog, err := ociarchive.GoBinary(ctx, moduleRoot, "./units/ballast")
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "ballast.tar")
	if _, err := ociarchive.WriteFile(archive, ociarchive.Unit(ballastImage, prog)); err != nil {
		t.Fatal(err)
	}
	a := mustDaemon(t, "chunked")
	if _, err := importImage(ctx, a, archive, ballastImage); err != nil {
		t.Fatal(err)
	}
	const id = "chunked"
	if _, err := a.c.Start(ctx, api.RunRequest{ID: id,
		Unit:   unit.Spec{Image: ballastImage, Env: []string{"SIZE_MB=64", "FILL=random", "TICK_MS=100", "VERIFY_EVERY=2", "CHANGE_PCT=1"}},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork}}); err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, a, id)
	out := a.stdout(id)
	waitBallast(t, out, "the ballast's first verified line", func(l ballastLine) bool { return l.Verified > 0 })

	parkMeasured := func(what string) (api.Park, int64) {
		t.Helper()
		before := stateOf(t, a).bytes
		p, err := a.c.Park(ctx, id)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if p.Checkpoint == nil || p.Checkpoint.ImageBytes < 64<<20 {
			t.Fatalf("%s: checkpoint %+v: want the 64 MiB buffer", what, p.Checkpoint)
		}
		added := stateOf(t, a).bytes - before
		t.Logf("%s: image %d B, the store grew by %d B (%.2f%%)", what, p.Checkpoint.ImageBytes, added, 100*float64(added)/float64(p.Checkpoint.ImageBytes))
		return p, added
	}
	// resumeVerified resumes the run on d and waits for the ballast to
	// verify every page's word after the last line it wrote on a.
	resumeVerified := func(d *daemon, what string) {
		t.Helper()
		atPark := ballastLines(t, out)
		last := atPark[len(atPark)-1].Counter
		if _, err := d.c.Resume(ctx, id); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		ls := waitBallast(t, d.stdout(id), what+": a line verified after it", func(l ballastLine) bool { return l.Verified > last })
		ballastOnce(t, ls)
	}

	p1, added1 := parkMeasured("first park")
	if added1 < p1.Checkpoint.ImageBytes*9/10 {
		t.Fatalf("the first park stored %d bytes of a %d-byte image", added1, p1.Checkpoint.ImageBytes)
	}
	resumeVerified(a, "first resume")
	signalUnits(t, a, syscall.SIGUSR2)
	waitBallast(t, out, "the ballast's change", func(l ballastLine) bool { return l.Changes == 1 })
	p2, added2 := parkMeasured("second park, after 1% changed")
	if added2*5 > p2.Checkpoint.ImageBytes {
		t.Fatalf("the second park stored %d bytes of a %d-byte image: more than 20%%", added2, p2.Checkpoint.ImageBytes)
	}
	resumeVerified(a, "second resume")
	if err := verifyRun(ctx, a, id); err != nil {
		t.Fatal(err)
	}
	p3, _ := parkMeasured("third park")

	// The bundle: every object once, far less than three images.
	var buf bytes.Buffer
	if err := a.c.Export(ctx, id, &buf); err != nil {
		t.Fatalf("export: %v", err)
	}
	members := map[string]int{}
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		members[h.Name]++
		if members[h.Name] > 1 {
			t.Fatalf("the bundle carries %s twice", h.Name)
		}
	}
	image := p3.Checkpoint.ImageBytes
	t.Logf("bundle of three parks: %d members, %d B (%.2f× one image)", len(members), buf.Len(), float64(buf.Len())/float64(image))
	if int64(buf.Len()) > image*3/2 {
		t.Fatalf("a bundle of three parks is %d bytes, one image %d: the chunks the parks share are not carried once", buf.Len(), image)
	}

	// A second run of the same unit, the operator's too: its first park
	// lists the pages it shares with the first run's in that run's slabs
	// (its kin, docs/chunked-images.md), and it resumes as one process.
	const kin = "chunked-kin"
	if _, err := a.c.Start(ctx, api.RunRequest{ID: kin,
		Unit:   unit.Spec{Image: ballastImage, Env: []string{"SIZE_MB=64", "FILL=random", "TICK_MS=100", "VERIFY_EVERY=2"}},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork}}); err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, a, kin)
	kinOut := a.stdout(kin)
	waitBallast(t, kinOut, "the kin's first verified line", func(l ballastLine) bool { return l.Verified > 0 })
	before := stateOf(t, a).bytes
	pk, err := a.c.Park(ctx, kin)
	if err != nil {
		t.Fatalf("the kin's first park: %v", err)
	}
	added := stateOf(t, a).bytes - before
	if pk.Checkpoint == nil {
		t.Fatal("the kin's first park: no checkpoint")
	}
	t.Logf("the kin's first park: image %d B, the store grew by %d B (%.2f%%)", pk.Checkpoint.ImageBytes, added, 100*float64(added)/float64(pk.Checkpoint.ImageBytes))
	if added*5 > pk.Checkpoint.ImageBytes {
		t.Fatalf("the kin's first park stored %d bytes of a %d-byte image: more than 20%%", added, pk.Checkpoint.ImageBytes)
	}
	atPark := ballastLines(t, kinOut)
	if _, err := a.c.Resume(ctx, kin); err != nil {
		t.Fatalf("the kin's resume: %v", err)
	}
	last := atPark[len(atPark)-1].Counter
	ballastOnce(t, waitBallast(t, kinOut, "the kin: a line verified after its resume", func(l ballastLine) bool { return l.Verified > last }))
	if err := verifyRun(ctx, a, kin); err != nil {
		t.Fatal(err)
	}

	// Another host, chunks off: the bundle imports, and the run resumes
	// from its chunks.
	b := mustDaemon(t, "plain", func(d *daemon) { d.flags = append(d.flags, "--chunked-images=false") })
	if _, err := importImage(ctx, b, archive, ballastImage); err != nil {
		t.Fatal(err)
	}
	trustHost(t, a, b)
	if _, err := b.c.Import(ctx, bytes.NewReader(buf.Bytes()), ""); err != nil {
		t.Fatalf("import: %v", err)
	}
	closeAtEnd(t, b, id)
	prior := ballastLines(t, out)
	resumeVerified(b, "resume on the second host")
	ballastOnce(t, append(prior, ballastLines(t, b.stdout(id))...))
	if _, err := b.c.Park(ctx, id); err != nil {
		t.Fatalf("a whole park after chunked ones: %v", err)
	}
	if err := verifyRun(ctx, b, id); err != nil {
		t.Fatal(err)
	}
}
