//go:build linux

package executor_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestRemoveRuncLeftover: a runc restore that died before it wrote its
// state (a daemon killed in the middle of a resume) leaves its directory
// in runc's root, the unit's root file system still bound on its
// criu-root, and runc refuses every later restore of that id: the
// container "already exists". Removing the sandbox, as a reconcile does,
// clears it, and the park restores.
func TestRemoveRuncLeftover(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "runc-leftover"
	s := mustStart(t, id, spec, out)
	waitLines(t, out.Stdout, "a line", func(ls []line) bool { return len(ls) > 0 })
	cp := parkAway(t, s)
	cfg := client.Config()
	left := filepath.Join(cfg.RuncRoot, cfg.Namespace, id)
	if err := os.MkdirAll(filepath.Join(left, "criu-root"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(t.TempDir(), filepath.Join(left, "criu-root"), "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Unmount(filepath.Join(left, "criu-root"), syscall.MNT_DETACH)
		_ = os.RemoveAll(left)
	})
	if _, _, err := client.Restore(ctx, id, spec, cp, out); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("a restore beside runc's leftover: %v, want runc's refusal", err)
	}
	if err := client.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	s, _, err := client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatalf("the restore after the remove: %v", err)
	}
	destroy(t, s)
}

// TestDestroyRuncBusy: a sandbox whose runc directory still has a mount
// below it (a restore killed with the daemon leaves the unit's root bound
// on criu-root) is destroyed all the same: runc could not remove its
// state directory ("device or resource busy"), and the task stayed.
func TestDestroyRuncBusy(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	const id = "runc-busy"
	s, err := client.Start(ctx, id, oracleSpec(), out)
	if err != nil {
		t.Fatal(err)
	}
	cfg := client.Config()
	busy := filepath.Join(cfg.RuncRoot, cfg.Namespace, id, "criu-root")
	if err := os.MkdirAll(busy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(t.TempDir(), busy, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(busy, syscall.MNT_DETACH) })
	if err := s.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if ids, err := client.List(ctx); err != nil || slices.Contains(ids, id) {
		t.Fatalf("sandboxes after the destroy: %v, %v", ids, err)
	}
}
