//go:build linux

package executor_test

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/runrecordd/runrecordd/internal/executor"
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
	if b, _ := os.ReadFile(out.Stdout); len(b) != 0 {
		t.Fatalf("the unit wrote before it began: %q", b)
	}
	if err := s.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	ls := waitLines(t, out.Stdout, "a line", func(ls []line) bool { return len(ls) >= 1 })
	if ls[0].Pid != 1 || ls[0].Checksum == "" {
		t.Fatalf("first line %+v", ls[0])
	}
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
