//go:build linux

package executor

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// TestBudgeted: a layer of exactly its budget passes; one byte more fails
// with ErrTooLarge, having passed on no more than the budget.
func TestBudgeted(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 10000)
	var out bytes.Buffer
	if n, err := io.Copy(&out, budgeted(bytes.NewReader(data), 10000)); err != nil || n != 10000 {
		t.Fatalf("at the budget: %d, %v", n, err)
	}
	out.Reset()
	_, err := io.Copy(&out, budgeted(bytes.NewReader(data), 9999))
	if !errors.Is(err, ErrTooLarge) || out.Len() > 9999 {
		t.Fatalf("one byte over: %v, %d bytes passed", err, out.Len())
	}
}

// TestLayerBoundSparse: a sparse file counts at its logical size, and the
// walk stops once past the budget.
func TestLayerBoundSparse(t *testing.T) {
	upper := t.TempDir()
	f, err := os.Create(filepath.Join(upper, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(upper, "small"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	mounts := []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"workdir=/w", "upperdir=" + upper, "lowerdir=/l"}}}
	n, err := layerBound(context.Background(), mounts, 1<<50)
	if err != nil || n < 1<<40 {
		t.Fatalf("bound %d (%v), want at least 1 TiB", n, err)
	}
	if n, err := layerBound(context.Background(), mounts, 1<<20); err != nil || n <= 1<<20 {
		t.Fatalf("bound under a 1 MiB budget: %d (%v), want over it", n, err)
	}
	if err := os.Remove(filepath.Join(upper, "sparse")); err != nil {
		t.Fatal(err)
	}
	if n, err := layerBound(context.Background(), mounts, 1<<20); err != nil || n > 8<<10 {
		t.Fatalf("bound of one small file: %d (%v)", n, err)
	}
	if _, err := layerBound(context.Background(), []mount.Mount{{Type: "fuse", Source: "x"}}, 1<<20); err == nil {
		t.Fatal("measured a snapshot it cannot read")
	}
}

// TestCappedOutput: a stream stops at its cap, says so once, counts what
// it dropped, and a file reopened at its cap stays there without a second
// note.
func TestCappedOutput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stderr")
	open := func() *capped {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		w, err := newCapped(f, "stderr", 10, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w := open()
	for _, s := range []string{"0123", "456789ab", "cdef"} {
		if n, err := w.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("write %q: %d, %v", s, n, err)
		}
	}
	want := "0123456789" + capNote("stderr", 10)
	if b, _ := os.ReadFile(path); string(b) != want {
		t.Fatalf("file %q, want %q", b, want)
	}
	if got := w.omitted.Load(); got != 6 {
		t.Fatalf("omitted %d, want 6", got)
	}
	w = open()
	if _, err := w.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != want || strings.Count(string(b), "runrecordd:") != 1 {
		t.Fatalf("reopened at its cap: file %q", b)
	}
}

// TestUnitLimits: a unit's spec sets its oom_score_adj and every
// resource limit, soft and hard, keeping one the spec already sets
// (containerd's RLIMIT_NOFILE); the image judge then holds a restore to
// them all.
func TestUnitLimits(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "unit"},
		oci.WithRlimit(&specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Soft: 100, Hard: 200}), withUnitLimits(77))
	if err != nil {
		t.Fatal(err)
	}
	if s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj != UnitOOMScoreAdj {
		t.Fatalf("oom_score_adj %v, want %d", s.Process.OOMScoreAdj, UnitOOMScoreAdj)
	}
	got := map[string]specs.POSIXRlimit{}
	for _, r := range s.Process.Rlimits {
		if _, ok := got[r.Type]; ok {
			t.Fatalf("%s set twice", r.Type)
		}
		got[r.Type] = r
	}
	for name, want := range map[string][2]uint64{
		"RLIMIT_NOFILE": {100, 200}, "RLIMIT_NPROC": {77, 77}, "RLIMIT_CORE": {0, 0}, "RLIMIT_NICE": {0, 0},
		"RLIMIT_RTPRIO": {0, 0}, "RLIMIT_MEMLOCK": {8 << 20, 8 << 20}, "RLIMIT_STACK": {8 << 20, rlimInfinity},
	} {
		if r := got[name]; r.Soft != want[0] || r.Hard != want[1] {
			t.Errorf("%s %d/%d, want %d/%d", name, r.Soft, r.Hard, want[0], want[1])
		}
	}
	p, err := criu.PolicyOf(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rlimits) != 16 || p.OOMScoreAdj == nil || *p.OOMScoreAdj != UnitOOMScoreAdj {
		t.Fatalf("the judge's policy: %d limits, oom_score_adj %v", len(p.Rlimits), p.OOMScoreAdj)
	}
}
