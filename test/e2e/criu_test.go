//go:build linux

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// criuBuildEnv names a CRIU build manifest for the daemons of the tests
// that read it (serve --criu-build), in place of the one deploy/setup.sh
// installs (criu.BuildFile): for a host whose CRIU was built by hand.
const criuBuildEnv = "RUNRECORDD_CRIU_BUILD"

// criuBuildFile is the manifest the tests' daemons read.
func criuBuildFile() string {
	if f := os.Getenv(criuBuildEnv); f != "" {
		return f
	}
	return criu.BuildFile
}

// needsFastPath skips t when d turned the fast path off (flag, e.g.
// "--lazy-served") for want of a deploy/criu patch, saying which: on a
// host set up by deploy/setup.sh every patch is there and t runs.
func needsFastPath(t *testing.T, d *daemon, flag string) {
	t.Helper()
	if off := fastPathOff(t, d, flag); off != "" {
		t.Skipf("the daemon turned %s off: %s", flag, off)
	}
}

// fastPathOff is why d turned the fast path off (flag, e.g.
// "--lazy-resume") for want of a deploy/criu patch; empty when it did
// not.
func fastPathOff(t *testing.T, d *daemon, flag string) string {
	t.Helper()
	h, err := d.c.Host(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range h.CRIU.Off {
		if why, ok := strings.CutPrefix(off, flag+": "); ok {
			return why
		}
	}
	return ""
}

// hostOut is `runrecordd host` of d, each line's runs of blanks made one
// space.
func hostOut(t *testing.T, d *daemon) string {
	t.Helper()
	out := cli(t, "host", "--socket", d.socket)
	t.Logf("runrecordd host of the %s daemon:\n%s", d.name, out)
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return "\n" + strings.Join(lines, "\n") + "\n"
}

// TestHostCRIU: `runrecordd host` and /metrics show the CRIU build the
// daemon runs — each patch as internal/criu identifies it here, with its
// sha256 when the build is known — and a daemon given a manifest of
// another binary calls the build not known, runs with it, and turns
// --lazy-served off, naming the patch it needs.
func TestHostCRIU(t *testing.T) {
	privileged(t)
	manifest := criuBuildFile()
	want, err := criu.Identify("criu", manifest)
	if err != nil {
		t.Fatal(err)
	}
	d := mustDaemon(t, "criu-host", func(d *daemon) { d.flags = []string{"--criu-build", manifest} })
	out := hostOut(t, d)
	if !strings.Contains(out, "\nCRIU build: "+want.Binary+" ") {
		t.Errorf("runrecordd host does not show the CRIU build at %s", want.Binary)
	}
	if (want.Record != nil) != strings.Contains(out, "(deploy/setup.sh's build)") {
		t.Errorf("runrecordd host: known %v expected (%s)", want.Record != nil, want.Unknown)
	}
	var nums []string
	for _, p := range want.Patches() {
		line := "\npatch " + p + " "
		if m := want.Record; m != nil {
			for _, f := range m.Patches {
				if f.Name == p {
					line += "sha256:" + f.SHA256
				}
			}
		}
		if !strings.Contains(out, line) {
			t.Errorf("runrecordd host does not show %q", line)
		}
		n, _, _ := strings.Cut(p, "-")
		nums = append(nums, n)
	}
	if got := strings.Count(out, "\npatch "); got != len(want.Patches()) {
		t.Errorf("runrecordd host shows %d patches, want %d", got, len(want.Patches()))
	}
	can := "what upstream CRIU can"
	if c := want.Capabilities(); len(c) > 0 {
		names := make([]string, len(c))
		for i, x := range c {
			names[i] = string(x)
		}
		can = strings.Join(names, ", ")
	}
	if !strings.Contains(out, "\ncan: "+can+"\n") {
		t.Errorf("runrecordd host does not say the build can %q", can)
	}
	info := warmMetrics(t, d, "runrecordd_criu_info")
	if len(info) != 1 {
		t.Fatalf("runrecordd_criu_info: %v, want one line", info)
	}
	for k, v := range info {
		if v != 1 || !strings.Contains(k, `patches="`+strings.Join(nums, ",")+`"`) || !strings.Contains(k, `version="4.2`) {
			t.Errorf("metric %s %v, want patches %v", k, v, nums)
		}
	}

	// A manifest of another binary (one byte changed in its hash).
	other := filepath.Join(t.TempDir(), "criu.json")
	path, err := exec.LookPath("criu")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(bin, 0))
	m := criu.BuildRecord{Version: "4.2.1", Binary: path, BinarySHA256: hex.EncodeToString(sum[:]),
		Source:  criu.Hashed{Name: "criu_4.2.1.orig.tar.xz", SHA256: hex.EncodeToString(sum[:])},
		Patches: []criu.Hashed{{Name: criu.Patch(criu.KeepsUffds), SHA256: hex.EncodeToString(sum[:])}}}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, b, 0o644); err != nil {
		t.Fatal(err)
	}
	u := mustDaemon(t, "criu-unknown", func(d *daemon) {
		d.flags = []string{"--criu-build", other} // --lazy-resume and --lazy-served at their defaults
	})
	out = hostOut(t, u)
	for _, w := range []string{"not known: " + criu.ErrOtherBinary.Error(), "\noff: --lazy-served: the CRIU at " + path + " lacks deploy/criu/2-lazy-pages-keep-uffds.patch"} {
		if !strings.Contains(out, w) {
			t.Errorf("runrecordd host does not say %q", w)
		}
	}
	for k := range warmMetrics(t, u, "runrecordd_criu_info") {
		if !strings.Contains(k, `known="false"`) {
			t.Errorf("metric %s, want known=\"false\"", k)
		}
	}
	if off := warmMetrics(t, u, "runrecordd_criu_fast_path_off"); off[`runrecordd_criu_fast_path_off{flag="--lazy-served"}`] != 1 {
		t.Errorf("runrecordd_criu_fast_path_off %v, want --lazy-served", off)
	}
	if log, _ := os.ReadFile(u.log); !strings.Contains(string(log), "--lazy-served turned off") {
		t.Errorf("the daemon's log does not say --lazy-served was turned off")
	}
}

// TestLazyResumeOff: where `criu check --feature uffd-noncoop` fails, a
// daemon at its defaults starts with --lazy-resume and --lazy-served off,
// says why (runrecordd host, /metrics, its log) and resumes eagerly; with
// --lazy-resume given it refuses to start. The CRIU is a stand-in first on
// PATH that fails that check alone and runs the real one for the rest,
// with the real build's bytes after its script (where the patches' marks
// are read) and a build record naming it.
func TestLazyResumeOff(t *testing.T) {
	privileged(t)
	real, err := exec.LookPath("criu")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := criu.ReadBuildRecord(criuBuildFile())
	if err != nil {
		t.Skipf("no record of this host's CRIU build (deploy/setup.sh writes it): %v", err)
	}
	bin, err := os.ReadFile(real)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	standIn := filepath.Join(dir, "bin", "criu")
	if err := os.Mkdir(filepath.Dir(standIn), 0o755); err != nil {
		t.Fatal(err)
	}
	// The shell never reads past exec or exit: the binary after them is
	// data.
	script := "#!/bin/sh\nif [ \"$*\" = \"check --feature uffd-noncoop\" ]; then echo 'stand-in: no uffd-noncoop' >&2; exit 1; fi\n" +
		"exec " + real + " \"$@\"\nexit 127\n"
	b := append([]byte(script), bin...)
	if err := os.WriteFile(standIn, b, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	rec.Binary, rec.BinarySHA256 = standIn, hex.EncodeToString(sum[:])
	manifest := filepath.Join(dir, "criu.json")
	if j, err := json.Marshal(rec); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(manifest, j, 0o644); err != nil {
		t.Fatal(err)
	}
	d := mustDaemon(t, "lazy-off", func(d *daemon) {
		d.env = []string{"PATH=" + filepath.Dir(standIn) + string(os.PathListSeparator) + os.Getenv("PATH")}
		d.flags = []string{"--criu-build", manifest}
	})
	out := hostOut(t, d)
	for _, w := range []string{"(deploy/setup.sh's build)", "\noff: --lazy-resume: criu check --feature uffd-noncoop fails\n", "\noff: --lazy-served: off with --lazy-resume\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("runrecordd host does not say %q", w)
		}
	}
	if off := warmMetrics(t, d, "runrecordd_criu_fast_path_off"); off[`runrecordd_criu_fast_path_off{flag="--lazy-resume"}`] != 1 {
		t.Errorf("runrecordd_criu_fast_path_off %v, want --lazy-resume", off)
	}
	if log, _ := os.ReadFile(d.log); !strings.Contains(string(log), "--lazy-resume turned off") || !strings.Contains(string(log), "stand-in: no uffd-noncoop") {
		t.Errorf("the daemon's log does not say --lazy-resume was turned off, and why")
	}
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "lazy-off"
	startOracle(t, d, id, oracleImage)
	_, atPark := park(t, d, id)
	if r := resume(t, d, id, nil, atPark); r.Restore.Lazy || r.Restore.Served {
		t.Fatalf("resume: restore %+v, want an eager one", r.Restore)
	}
	_, _ = park(t, d, id)

	// Given, it refuses the start.
	mustStop(t, d)
	d.flags = append(d.flags, "--lazy-resume")
	err = d.start()
	if err == nil || !strings.Contains(err.Error(), "lazy resume: criu check --feature uffd-noncoop") {
		t.Fatalf("a start with --lazy-resume given: %v, want it refused for uffd-noncoop", err)
	}
	d.flags = d.flags[:len(d.flags)-1]
	mustStart(t, d)
}
