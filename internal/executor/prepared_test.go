//go:build linux

package executor_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/ociarchive"
)

// A sandbox Create made holds its task created and not started: nothing
// of the unit has run (no output) until Begin, and then it runs as a
// started one does.
func TestCreateBegin(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "warm")
	s, err := client.Create(ctx, "warm-begin", oracleSpec(), out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	if st, err := s.Status(ctx); err != nil || st != "created" {
		t.Fatalf("status %q, %v; want created", st, err)
	}
	if n, shim, err := s.Resident(ctx); err != nil || n == 0 || !shim {
		t.Fatalf("resident %d (shim %v), %v", n, shim, err)
	}
	begins(t, s, out)
}

// A sandbox created and never begun is removed whole: by its own Destroy
// (a warm sandbox discarded), and by Remove from another client (a
// restarted daemon's reconcile removing what a killed one left).
func TestCreatedRemoved(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	s, err := client.Create(ctx, "warm-destroy", oracleSpec(), outputs(t, "warm"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(ctx); err != nil {
		t.Fatalf("destroy of a created sandbox: %v", err)
	}
	if _, err := client.Create(ctx, "warm-remove", oracleSpec(), outputs(t, "warm")); err != nil {
		t.Fatal(err)
	}
	other, err := executor.Connect(ctx, client.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Remove(ctx, "warm-remove"); err != nil {
		t.Fatalf("remove of a created sandbox: %v", err)
	}
	ids, err := client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ids, "warm-destroy") || slices.Contains(ids, "warm-remove") {
		t.Fatalf("left: %v", ids)
	}
}

// buildGate builds cmd/runrecordd-gate, statically linked, into dir.
func buildGate(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, executor.GateName)
	cmd := exec.Command("go", "build", "-o", p, "./cmd/runrecordd-gate")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/runrecordd-gate: %v\n%s", err, out)
	}
	return p
}

// A gated sandbox's task is started, its gate waiting: nothing of the
// unit runs (no output) until Begin's word, and then the unit's process
// runs as pid 1, as a started one does. Its FIFO goes with it.
func TestCreateBeginGated(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	gated, cfg := gatedClient(t)
	out := outputs(t, "gated")
	s, err := gated.Create(ctx, "warm-gated", oracleSpec(), out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	fifo := filepath.Join(cfg.StateDir, "gate", "warm-gated")
	if st, err := s.Status(ctx); err != nil || st != "running" {
		t.Fatalf("status %q, %v; want running (the gate)", st, err)
	}
	time.Sleep(200 * time.Millisecond) // room for a unit that was not held to write
	begins(t, s, out)
	if _, err := os.Stat(fifo); !os.IsNotExist(err) {
		t.Fatalf("the gate's FIFO after Begin: %v", err)
	}
}

// A gate that is not a statically linked executable is refused: it would
// not run in an image without a libc.
func TestGateRefusedDynamic(t *testing.T) {
	privileged(t)
	cfg := client.Config()
	cfg.Gate = "/bin/true"
	c, err := executor.Connect(context.Background(), cfg)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, executor.ErrGate) {
		t.Fatalf("connect with a dynamic gate: %v, want ErrGate", err)
	}
}

// A gated sandbox discarded before Begin takes its FIFO with it, and its
// unit never ran.
func TestGatedDiscarded(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	gated, cfg := gatedClient(t)
	out := outputs(t, "gated")
	s, err := gated.Create(ctx, "warm-gated-discard", oracleSpec(), out)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "gate", "warm-gated-discard")); !os.IsNotExist(err) {
		t.Fatalf("the gate's FIFO after Destroy: %v", err)
	}
	if b, _ := os.ReadFile(out.Stdout); len(b) != 0 {
		t.Fatalf("a discarded gated sandbox's unit wrote: %q", b)
	}
}

// A gated sandbox of an image whose USER is not root begins as one of
// root: the gate, run as that user, can open its FIFO.
func TestCreateBeginGatedUser(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	bin, err := ociarchive.GoBinary(ctx, "../..", "./units/oracle")
	if err != nil {
		t.Fatal(err)
	}
	const name = "runrecordd.local/oracle-nobody:1"
	img := ociarchive.Unit(name, bin)
	img.User = "65534:65534"
	path := filepath.Join(t.TempDir(), "nobody.tar")
	if _, err := ociarchive.WriteFile(path, img); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ImportFile(ctx, path, name); err != nil {
		t.Fatal(err)
	}
	gated, _ := gatedClient(t)
	spec := oracleSpec()
	spec.Image, spec.ImageDigest = name, ""
	out := outputs(t, "gated-nobody")
	s, err := gated.Create(ctx, "warm-gated-nobody", spec, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	begins(t, s, out)
}

// begins checks that the oracle in s has written nothing, begins it, and
// checks that it then runs, as pid 1.
func begins(t *testing.T, s *executor.Sandbox, out executor.Output) {
	t.Helper()
	if b, _ := os.ReadFile(out.Stdout); len(b) != 0 {
		t.Fatalf("the unit wrote before it began: %q", b)
	}
	if err := s.Begin(context.Background()); err != nil {
		b, _ := os.ReadFile(out.Stderr)
		t.Fatalf("begin: %v; stderr %q", err, b)
	}
	ls := waitLines(t, out.Stdout, "a line", func(ls []line) bool { return len(ls) >= 1 })
	if ls[0].Pid != 1 || ls[0].Checksum == "" {
		t.Fatalf("first line %+v", ls[0])
	}
}

// gatedClient is a client of the test's containerd with a gate built
// for it, closed after the test's sandboxes are destroyed.
func gatedClient(t *testing.T) (*executor.Client, executor.Config) {
	t.Helper()
	cfg := client.Config()
	cfg.Gate = buildGate(t, t.TempDir())
	gated, err := executor.Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gated.Close() })
	return gated, cfg
}
