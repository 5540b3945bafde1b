//go:build linux

package executor_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/executor"
)

// TestRestoreStacksSeccomp: the filter a restore stacks is the one runc
// installs in a unit under the same spec (sameRules); and after a
// checkpoint and restore every thread of the unit is in filter mode with
// that filter installed first, then the unit's own; a second checkpoint
// and restore adds no filter.
func TestRestoreStacksSeccomp(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "seccomp"
	s := mustStart(t, id, spec, out)
	waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt > 0 })
	own, err := executor.ReadFiltersForTest(int(s.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	host, err := s.SpecFiltersForTest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !sameRules(host, own) {
		t.Fatalf("runc installed %s in the unit; the restore would stack %s", describe(own), describe(host))
	}
	cp, atDump := checkpointAway(t, s, out)
	s, _, err = client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	waitLines(t, out.Stdout, "a line verified after the restore", func(ls []line) bool { return last(ls).VerifiedAt > atDump.Counter })
	// The spec's filter first, then the unit's own; runc's compile may
	// be the very bytes of the unit's, which is then not stacked again.
	want := append(append([]criu.Filter(nil), host...), own...)
	if sameFilters(host, own) {
		want = own
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", s.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(int(s.Pid())), "task", task.Name(), "status"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(status), "\nSeccomp:\t2\n") {
			t.Errorf("thread %d: not in filter mode", tid)
		}
		got, err := executor.ReadFiltersForTest(tid)
		if err != nil {
			t.Fatal(err)
		}
		if !sameFilters(got, want) {
			t.Errorf("thread %d holds %s; want the spec's then its own, %s", tid, describe(got), describe(want))
		}
	}
	t.Logf("%d threads, each with %s", len(tasks), describe(want))
	cp, atDump = checkpointAway(t, s, out)
	s, _, err = client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	waitLines(t, out.Stdout, "a line verified after the second restore", func(ls []line) bool { return last(ls).VerifiedAt > atDump.Counter })
	if got, err := executor.ReadFiltersForTest(int(s.Pid())); err != nil || !sameFilters(got, want) {
		t.Fatalf("restored twice, the unit holds %s (%v); want %s", describe(got), err, describe(want))
	}
}

// stubInsns bounds the head of runc's filter that may differ between two
// compiles of one profile: its ENOSYS stub dispatches on the
// architectures in the order of a Go map (runc's
// libcontainer/seccomp/patchbpf).
const stubInsns = 32

// sameRules says whether a and b are the same filters as runc compiles
// them twice: of one length and flags, the same instructions past the
// stub.
func sameRules(a, b []criu.Filter) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i].Insns) != len(b[i].Insns) || len(a[i].Insns) <= 8*stubInsns || a[i].Flags != b[i].Flags ||
			!bytes.Equal(a[i].Insns[8*stubInsns:], b[i].Insns[8*stubInsns:]) {
			return false
		}
	}
	return true
}

func sameFilters(a, b []criu.Filter) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Insns, b[i].Insns) || a[i].Flags != b[i].Flags {
			return false
		}
	}
	return true
}

func describe(fs []criu.Filter) string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, fmt.Sprintf("%d instructions (flags %#x)", len(f.Insns)/8, f.Flags))
	}
	return fmt.Sprintf("%d filters [%s]", len(fs), strings.Join(parts, ", "))
}
