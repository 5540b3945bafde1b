//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/ociarchive"
)

// The tests run the real daemon, containerd, runc and CRIU as root. They do
// not skip on a host that lacks them: TestMain fails loudly, because CI runs
// as root with all of it installed. RUNRECORDD_SKIP_PRIVILEGED=1 skips
// them, saying so, for a developer machine without root.
const skipEnv = "RUNRECORDD_SKIP_PRIVILEGED"

// moduleRoot is the module's directory, relative to this package's.
const moduleRoot = "../.."

const (
	// oracleImage is the name the oracle's image is imported under.
	oracleImage = "runrecordd.test/oracle:1"
	// variantEnv is set in the variant image's config: the same program
	// in a different image, so under a different digest.
	variantEnv = "RUNRECORDD_TEST_VARIANT=1"
)

var (
	skipReason string // set when RUNRECORDD_SKIP_PRIVILEGED=1

	daemonBinary string // the runrecordd binary under test
	etcdMember   string // the etcd member program (etcdtest.Build)

	// oracleArchive is the oracle's OCI archive; variantArchive the same
	// program in an image with one more environment entry.
	oracleArchive, variantArchive string
	oracleDigest, variantDigest   string

	// sharedDaemon serves the tests that can share one; started by the
	// first of them, stopped (and checked) by TestMain.
	sharedDaemon *daemon
)

func TestMain(m *testing.M) {
	os.Exit(mainTest(m))
}

func mainTest(m *testing.M) int {
	if err := setParallel(); err != nil { // parallel_test.go
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if os.Getenv(skipEnv) == "1" {
		skipReason = skipEnv + "=1: skipping runrecordd's end-to-end tests (the daemon with real containerd, runc and CRIU, as root)"
		fmt.Fprintln(os.Stderr, "e2e:", skipReason)
		return m.Run()
	}
	if err := preflight(); err != nil {
		fmt.Fprintf(os.Stderr, "\n*** e2e tests need root, containerd, runc and a CRIU whose `criu check` passes:\n*** %v\n*** run deploy/setup.sh as root, or set %s=1 to skip these tests.\n\n", err, skipEnv)
		return 1
	}
	// What an earlier run on this machine left is not this run's to
	// answer for: the final check reports only what is new.
	before := leftovers()
	dir, err := os.MkdirTemp("", "rre-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	t0 := time.Now()
	if err := build(dir); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: built runrecordd, the units and etcd's member program in %v\n", time.Since(t0).Round(time.Millisecond))
	code := m.Run()
	etcdtest.CloseShared() // the fleet tests' cluster
	if sharedDaemon != nil {
		if err := sharedDaemon.shutdown(code != 0); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: shared daemon:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	if code == 0 {
		// A failed run keeps its daemons' directories to look at; a
		// passing one must leave nothing.
		left := slices.DeleteFunc(leftovers(), func(l string) bool { return slices.Contains(before, l) })
		if len(left) > 0 {
			fmt.Fprintf(os.Stderr, "e2e: the suite passed but left things behind:\n  %s\n", strings.Join(left, "\n  "))
			code = 1
		}
	}
	return code
}

// leftovers lists what the suite started and did not end: processes of
// its daemons' directories (containerd, shims, CRIU), processes in their
// sandboxes' cgroups (units), the cgroups themselves, stand-in CRIUs, and
// temporary directories.
func leftovers() []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
		if strings.Contains(cmd, filepath.Join(os.TempDir(), "rre-")) || cmd == "sleep 3600" {
			out = append(out, "process "+filepath.Base(filepath.Dir(p))+": "+cmd)
		}
	}
	daemonsMu.Lock()
	defer daemonsMu.Unlock()
	for _, d := range allDaemons {
		if n := d.cgroupProcs(); n > 0 {
			out = append(out, fmt.Sprintf("%d processes in the %s daemon's sandbox cgroups", n, d.name))
		}
		for _, c := range d.cgroupDirs() {
			out = append(out, "cgroup "+c)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "rre-*"))
	for _, d := range dirs {
		out = append(out, "directory "+d)
	}
	return out
}

func preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	for _, bin := range []string{"go", "containerd", "runc", "iptables-restore", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			return err
		}
	}
	return criu.Check(context.Background(), "")
}

// build builds the daemon, the oracle's two archives and the transcript
// units' archives into dir. The daemon builds while the units do: each
// `go build` ends in a link of its own, and the links need not wait for
// each other.
func build(dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var daemonErr, oracleErr, unitsErr, etcdErr error
	wg.Go(func() { daemonErr = buildDaemon(ctx, dir) })
	wg.Go(func() { oracleErr = buildOracle(ctx, dir) })
	wg.Go(func() { unitsErr = trBuildUnits(ctx, dir) }) // transcript_test.go
	wg.Go(func() {
		// The fleet tests' etcd members run as processes of their own
		// (fleetenv_test.go).
		etcdMember = filepath.Join(dir, "etcdmember")
		etcdErr = etcdtest.Build(ctx, etcdMember)
	})
	wg.Wait()
	return errors.Join(daemonErr, oracleErr, unitsErr, etcdErr)
}

// buildDaemon builds the daemon and, beside it, the gate its warm
// sandboxes start in (statically linked).
func buildDaemon(ctx context.Context, dir string) error {
	bin := filepath.Join(dir, "runrecordd")
	for _, b := range []struct{ out, pkg, cgo string }{{bin, "./cmd/runrecordd", ""}, {filepath.Join(dir, "runrecordd-gate"), "./cmd/runrecordd-gate", "0"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.out, b.pkg)
		cmd.Dir = moduleRoot
		if b.cgo != "" {
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out.Bytes())
		}
	}
	daemonBinary = bin
	return nil
}

// goBinaries builds the units' packages at once, each as
// ociarchive.GoBinary does.
func goBinaries(ctx context.Context, pkgs ...string) ([][]byte, error) {
	bins := make([][]byte, len(pkgs))
	errs := make([]error, len(pkgs))
	var wg sync.WaitGroup
	for i, p := range pkgs {
		wg.Go(func() { bins[i], errs[i] = ociarchive.GoBinary(ctx, moduleRoot, p) })
	}
	wg.Wait()
	return bins, errors.Join(errs...)
}

// buildOracle writes the oracle's archive and its variant's.
func buildOracle(ctx context.Context, dir string) error {
	prog, err := ociarchive.GoBinary(ctx, moduleRoot, "./units/oracle")
	if err != nil {
		return err
	}
	oracleArchive = filepath.Join(dir, "oracle.tar")
	d, err := ociarchive.WriteFile(oracleArchive, ociarchive.Unit(oracleImage, prog))
	if err != nil {
		return err
	}
	oracleDigest = d.Manifest.String()
	img := ociarchive.Unit(oracleImage, prog)
	img.Env = append(img.Env, variantEnv)
	variantArchive = filepath.Join(dir, "oracle-variant.tar")
	if d, err = ociarchive.WriteFile(variantArchive, img); err != nil {
		return err
	}
	variantDigest = d.Manifest.String()
	if variantDigest == oracleDigest {
		return fmt.Errorf("the variant image has the oracle's digest %s", oracleDigest)
	}
	return nil
}

func privileged(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}
