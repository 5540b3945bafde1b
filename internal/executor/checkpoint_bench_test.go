//go:build linux

package executor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
)

// BenchmarkCheckpointKeep: a checkpoint with Keep of one small sandbox (the
// oracle, five tmpfs mounts as every sandbox has), resumed after each, so
// that what is measured is CRIU's fixed cost per dump rather than memory
// written. dump-ms and frozen-ms are the medians of the executor's Dump
// (runc and CRIU) and of CRIU's frozen time; ns/op is the whole
// checkpoint, resume and image removal. Compare CRIU builds by running it
// with each installed in turn (docs/benchmarks.md).
func BenchmarkCheckpointKeep(b *testing.B) {
	if skipReason != "" {
		b.Skip(skipReason)
	}
	ctx := context.Background()
	dir := b.TempDir()
	out := executor.Output{Stdout: filepath.Join(dir, "o.out"), Stderr: filepath.Join(dir, "o.err")}
	s, err := client.Start(ctx, "bench-keep", oracleSpec(), out)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Destroy(context.Background()); err != nil {
			b.Error(err)
		}
	}()
	var dumps, frozen []time.Duration
	n := 0
	for b.Loop() {
		n++
		cp := executor.Checkpoint{
			ImageDir: filepath.Join(dir, fmt.Sprint("images-", n)),
			Rootfs:   filepath.Join(dir, fmt.Sprint("rootfs-", n, ".tar")),
			Keep:     true,
		}
		st, err := s.Checkpoint(ctx, cp)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Resume(ctx); err != nil {
			b.Fatal(err)
		}
		dumps = append(dumps, st.Dump)
		frozen = append(frozen, st.Frozen)
		if err := os.RemoveAll(cp.ImageDir); err != nil {
			b.Fatal(err)
		}
		if err := os.Remove(cp.Rootfs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(medianMs(dumps), "dump-ms")
	b.ReportMetric(medianMs(frozen), "frozen-ms")
}

// medianMs is the median of ds in milliseconds.
func medianMs(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}
