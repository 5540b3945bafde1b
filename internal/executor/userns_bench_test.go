//go:build linux

package executor_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/idmap"
)

// BenchmarkUserNamespace: the oracle (64 MiB of memory) started, parked
// (checkpoint, destroy) and resumed (eager restore, until its next line)
// without and with a user namespace, alternating in each iteration; with
// one, each iteration is a new run in a new range (its remapped snapshot
// made at the start). Medians in ms: start-, park- and resume-off/on, and
// of the resume: restore- (the Restore call, without the wait for the
// oracle's next tick, 0-100 ms after it), rootfs- (the rw layer's
// apply), task- (runc restore and CRIU) and criu- (CRIU's own).
func BenchmarkUserNamespace(b *testing.B) {
	if skipReason != "" {
		b.Skip(skipReason)
	}
	ctx := context.Background()
	times := map[string][]time.Duration{}
	n := 0
	for b.Loop() {
		n++
		for _, on := range []bool{false, true} {
			mode := "off"
			spec := oracleSpec()
			if on {
				mode = "on"
				r := idmap.Range{Base: 1<<20 + uint32(100+n)*idmap.Size}
				spec.UserNS = &r
			}
			dir := b.TempDir()
			out := executor.Output{Stdout: filepath.Join(dir, "o.out"), Stderr: filepath.Join(dir, "o.err")}
			id := fmt.Sprintf("bench-userns-%s-%d", mode, n)
			t0 := time.Now()
			s, err := client.Start(ctx, id, spec, out)
			if err != nil {
				b.Fatal(err)
			}
			times["start-"+mode] = append(times["start-"+mode], time.Since(t0))
			benchWait(b, out.Stdout, 1)
			cp := executor.Checkpoint{ImageDir: filepath.Join(dir, "images"), Rootfs: filepath.Join(dir, "rootfs.tar")}
			t0 = time.Now()
			if _, err := s.Checkpoint(ctx, cp); err != nil {
				b.Fatal(err)
			}
			if err := s.Destroy(ctx); err != nil {
				b.Fatal(err)
			}
			times["park-"+mode] = append(times["park-"+mode], time.Since(t0))
			seen := benchLines(out.Stdout)
			t0 = time.Now()
			s, rs, err := client.Restore(ctx, id, spec, cp, out)
			if err != nil {
				b.Fatal(err)
			}
			times["restore-"+mode] = append(times["restore-"+mode], time.Since(t0))
			times["rootfs-"+mode] = append(times["rootfs-"+mode], rs.Rootfs)
			times["task-"+mode] = append(times["task-"+mode], rs.Task)
			times["criu-"+mode] = append(times["criu-"+mode], rs.Forking+rs.Restore)
			benchWait(b, out.Stdout, seen+1)
			times["resume-"+mode] = append(times["resume-"+mode], time.Since(t0))
			if err := s.Destroy(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for k, v := range times {
		b.ReportMetric(medianMs(v), k+"-ms")
	}
}

// benchLines is how many whole lines the oracle's stdout holds.
func benchLines(path string) int {
	b, _ := os.ReadFile(path)
	return bytes.Count(b, []byte("\n"))
}

// benchWait waits until the oracle's stdout holds n lines.
func benchWait(b *testing.B, path string, n int) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for benchLines(path) < n {
		if time.Now().After(deadline) {
			b.Fatalf("no line %d in %s", n, path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
