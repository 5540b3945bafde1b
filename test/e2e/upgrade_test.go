//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/manifest"
)

// TestUpgradeKeepsParkedRuns parks the oracle under one kernel release,
// runc and CRIU build and resumes it under another the image-park probe
// accepts: the recorded manifest names the first ones' versions, and the
// resume judges them by the probe, not by equality. Then a park under this
// host's CRIU is refused on a CRIU of the next feature release (another
// image format), with manifest_mismatch naming criu.images, the run left
// parked; back on this host's CRIU, it resumes as the same process.
//
// The other builds are the real runc and CRIU behind wrappers that
// answer --version with another version and hand every other call to
// them: the restores are real, only the versions the daemon reads differ.
// The other kernel release is this kernel's under the UNAME26
// personality (setarch --uname-2.6), which the park's daemon, containerd,
// runc and CRIU run under: uname says 2.6.N. The park's CPU has a flag
// more than this one (a /proc/cpuinfo bound over the real one in the
// daemon's mount namespace): on this host's own CPU the resume is refused
// naming cpu.flags, then it resumes where the flag is back, under this
// host's kernel release, runc and CRIU (otherHost).
func TestUpgradeKeepsParkedRuns(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	runcVer, criuVer := realVersions(t)
	// Another patch level of each: what a patch upgrade changes.
	olderRunc, olderCRIU := otherPatch(t, runcVer), otherPatch(t, criuVer)
	older := versionWrappers(t, olderRunc, olderCRIU)
	cpuinfo, flag := moreFlags(t)
	d := mustDaemon(t, "upgrade", func(d *daemon) { d.env, d.bin = older, otherHost(t, cpuinfo, true) })
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "upgrade"
	startOracle(t, d, id, oracleImage)

	_, atPark := park(t, d, id)
	rec := recordedManifest(t, d, id)
	if rec[manifest.RuncVersion] != olderRunc || rec[manifest.CRIUVersion] != olderCRIU {
		t.Fatalf("recorded runc %q, criu %q; want the wrapped %q, %q", rec[manifest.RuncVersion], rec[manifest.CRIUVersion], olderRunc, olderCRIU)
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	if kernel := unix.ByteSliceToString(u.Release[:]); !strings.HasPrefix(rec[manifest.KernelRelease], "2.6.") || rec[manifest.KernelRelease] == kernel {
		t.Fatalf("recorded kernel.release %q; want the UNAME26 one (2.6.N), not this host's %q", rec[manifest.KernelRelease], kernel)
	}
	if _, hash := rec[manifest.CPUFeatures]; rec.Version() != manifest.Format2 || rec[manifest.CRIUImages] != manifest.CRIUFormat(criuVer) || rec[manifest.CPUFlags] == "" || hash {
		t.Fatalf("recorded manifest %v: want format 2 with criu.images %s and the CPU's flags", rec, manifest.CRIUFormat(criuVer))
	}
	if !slices.Contains(strings.Fields(rec[manifest.CPUFlags]), flag) {
		t.Fatalf("recorded cpu.flags %q lack the CPU's %s", rec[manifest.CPUFlags], flag)
	}
	// On this host's CPU, which lacks the flag: refused, naming cpu.flags.
	was, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	mustStop(t, d)
	d.env, d.bin = nil, ""
	mustStart(t, d)
	_, err = d.c.Resume(ctx, id)
	if ae := apiError(t, err, "manifest_mismatch"); !slices.Equal(ae.Keys, []string{manifest.CPUFlags}) || !strings.Contains(ae.Message, flag) {
		t.Fatalf("manifest mismatch keys %v, want [cpu.flags] naming %s: %v", ae.Keys, flag, ae)
	} else {
		t.Logf("on a CPU without %s, refused as it should be: %v", flag, ae)
	}
	unchanged(t, d, id, was)
	// The real kernel release, runc and CRIU, on a CPU with every flag.
	mustStop(t, d)
	d.bin = otherHost(t, cpuinfo, false)
	mustStart(t, d)
	resume(t, d, id, nil, atPark)

	// Parked under this host's CRIU; resumed under the next feature
	// release's: refused, naming the key, nothing changed.
	_, atPark = park(t, d, id)
	was, err = d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	mustStop(t, d)
	d.env = versionWrappers(t, runcVer, nextFeature(t, criuVer))
	mustStart(t, d)
	_, err = d.c.Resume(ctx, id)
	ae := apiError(t, err, "manifest_mismatch")
	if !slices.Equal(ae.Keys, []string{manifest.CRIUImages}) {
		t.Fatalf("manifest mismatch keys %v, want [criu.images]: %v", ae.Keys, ae)
	}
	t.Logf("refused as it should be: %v", ae)
	unchanged(t, d, id, was)
	mustStop(t, d)
	d.env = nil
	mustStart(t, d)
	resume(t, d, id, nil, atPark)
}

// recordedManifest is the manifest the last Suspended segment of run id
// records, read from d's store.
func recordedManifest(t *testing.T, d *daemon, id string) manifest.Manifest {
	t.Helper()
	s := mustShow(t, d, id)
	for i := len(s.Segments) - 1; i >= 0; i-- {
		if s.Segments[i].Kind == "suspended" {
			m, err := manifest.Decode(d.object(t, s.Segments[i].Manifest))
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	t.Fatalf("run %s: no suspended segment in %s", id, fmtSegments(s.Segments))
	return nil
}

// realVersions are the versions of the runc and CRIU on PATH, as the
// daemon reads them.
func realVersions(t *testing.T) (runc, criu string) {
	t.Helper()
	out, err := exec.Command("runc", "--version").Output()
	if err != nil {
		t.Fatalf("runc --version: %v", err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	runc = strings.TrimSpace(strings.TrimPrefix(first, "runc version"))
	out, err = exec.Command("criu", "--version").Output()
	if err != nil {
		t.Fatalf("criu --version: %v", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Version:"); ok {
			criu = strings.TrimSpace(v)
		}
	}
	if strings.Count(criu, ".") == 1 {
		criu += ".0"
	}
	return runc, criu
}

// versionParts splits MAJOR.MINOR.PATCH, failing t on anything else.
func versionParts(t *testing.T, v string) [3]int {
	t.Helper()
	var n [3]int
	parts := strings.SplitN(v, ".", 3)
	if len(parts) != 3 {
		t.Fatalf("version %q is not MAJOR.MINOR.PATCH", v)
	}
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil {
			t.Fatalf("version %q is not MAJOR.MINOR.PATCH", v)
		}
		n[i] = x
	}
	return n
}

// otherPatch is another patch level of the same feature release.
func otherPatch(t *testing.T, v string) string {
	n := versionParts(t, v)
	if n[2] > 0 {
		n[2]--
	} else {
		n[2]++
	}
	return fmt.Sprintf("%d.%d.%d", n[0], n[1], n[2])
}

// nextFeature is the next feature release's first version.
func nextFeature(t *testing.T, v string) string {
	n := versionParts(t, v)
	return fmt.Sprintf("%d.%d.0", n[0], n[1]+1)
}

// versionWrappers writes runc and criu wrappers into a new directory
// that answer --version with runcVer and criuVer and exec the real
// binaries (found on PATH now) for every other call, and returns the
// environment that puts them first on PATH.
func versionWrappers(t *testing.T, runcVer, criuVer string) []string {
	t.Helper()
	dir := t.TempDir()
	for name, version := range map[string]string{
		"runc": fmt.Sprintf("runc version %s\\ncommit: e2e-wrapper\\nspec: 1.2.1\\n", runcVer),
		"criu": fmt.Sprintf("Version: %s\\n", criuVer),
	} {
		real, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = --version ]; then printf '%s'; exit 0; fi\nexec %s \"$@\"\n", version, real)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH")}
}

// moreFlags writes a copy of /proc/cpuinfo whose CPUs have one flag more
// than this host's, and returns its path and the flag.
func moreFlags(t *testing.T) (string, string) {
	t.Helper()
	const flag = "e2e_upgrade_flag"
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	n := 0
	for i, l := range lines {
		if k, v, ok := strings.Cut(l, ":"); ok && (strings.TrimSpace(k) == "flags" || strings.TrimSpace(k) == "Features") {
			lines[i], n = k+": "+flag+v, n+1
		}
	}
	if n == 0 {
		t.Fatal("no CPU flags in /proc/cpuinfo")
	}
	p := filepath.Join(t.TempDir(), "cpuinfo")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, flag
}

// otherHost writes a runrecordd wrapper into a new directory that runs the
// binary under test as on another host, and returns its path: in a mount
// namespace of its own where cpuinfo is bound over /proc/cpuinfo (the CPU
// flags the daemon reads; CRIU asks the CPU itself), and, with uname26,
// under the UNAME26 personality (setarch --uname-2.6), which its
// containerd, runc, CRIU and units inherit: uname says 2.6.N, another
// kernel.release.
func otherHost(t *testing.T, cpuinfo string, uname26 bool) string {
	t.Helper()
	var tools [2]string
	for i, name := range []string{"unshare", "setarch"} {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		tools[i] = p
	}
	run := daemonBinary
	if uname26 {
		run = tools[1] + " --uname-2.6 " + daemonBinary
	}
	// A user namespace's runc may mount proc only where a proc mount is
	// fully visible (the kernel's mount_too_revealing): the one bound
	// over is not, so a whole one is mounted beside it first.
	whole := filepath.Join(t.TempDir(), "proc")
	if err := os.Mkdir(whole, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\nexec %s -m --propagation slave /bin/sh -c 'mount -t proc proc %s && mount --bind %s /proc/cpuinfo && exec %s \"$@\"' sh \"$@\"\n", tools[0], whole, cpuinfo, run)
	w := filepath.Join(t.TempDir(), "runrecordd")
	if err := os.WriteFile(w, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return w
}
