package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/bench/benchhost"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

const cgroup = "/runrecordd-chunkbench"

// dumpPlan is what `chunkbench dump` takes: n dumps of the unit (ballast
// or oracle) of size MiB into out/1 … out/n, the ballast changing pct
// percent of its memory between two, as mode says.
type dumpPlan struct {
	out, unit    string
	n, size, pct int
	mode         string
}

// dump takes the plan's dumps: of the ballast, which changes pct percent
// of its memory between two, or of the oracle (two processes, a held TCP
// connection over loopback), which changes only what it changes on its own
// in the second between two.
func dump(p dumpPlan) error {
	unitName, size := p.unit, p.size
	if unitName != "ballast" && unitName != "oracle" {
		return fmt.Errorf("no unit %q", unitName)
	}
	imageRef := "runrecordd.local/" + unitName + ":1"
	ctx := context.Background()
	if err := os.MkdirAll(p.out, 0o700); err != nil {
		return err
	}
	h, err := benchhost.Start(ctx, "rrcb-", cgroup)
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := h.ImportUnit(ctx, unitName, imageRef); err != nil {
		return err
	}
	spec := executor.Spec{Image: imageRef, Network: unit.NoNetwork, MemoryBytes: uint64(size+256) << 20,
		Env: []string{"SIZE_MB=" + strconv.Itoa(size), "TICK_MS=1000", "VERIFY_EVERY=1000000", "FILL=random",
			"CHANGE_PCT=" + strconv.Itoa(p.pct), "CHANGE_MODE=" + p.mode}}
	if unitName == "oracle" { // as bench/lazybench runs it
		spec.Network, spec.Env = unit.Loopback, []string{"SIZE_MB=" + strconv.Itoa(size), "TCP_PORT=7000"}
	}
	return dumps(ctx, h, spec, p)
}

// dumps starts the unit on h and takes the plan's dumps.
func dumps(ctx context.Context, h *benchhost.Host, spec executor.Spec, p dumpPlan) error {
	out, n := p.out, p.n
	o := executor.Output{Stdout: filepath.Join(h.Dir, "out"), Stderr: filepath.Join(h.Dir, "err")}
	sb, err := h.Exec.Start(ctx, "cb", spec, o)
	if err != nil {
		return err
	}
	defer sb.Destroy(context.Background())
	if _, err := waitLine(o.Stdout, func(l map[string]any) bool { return true }); err != nil {
		return err
	}
	for i := 1; i <= n; i++ {
		st, err := sb.Checkpoint(ctx, executor.Checkpoint{ImageDir: filepath.Join(out, strconv.Itoa(i)), Keep: true})
		if err != nil {
			return fmt.Errorf("dump %d: %w", i, err)
		}
		if err := sb.Resume(ctx); err != nil {
			return err
		}
		fmt.Printf("dump %d: %d pages written, %s of images, CRIU frozen %s\n", i, st.PagesWritten, mib(st.ImageBytes), st.Frozen)
		if i == n {
			break
		}
		if err := change(sb, spec, o.Stdout, i); err != nil {
			return err
		}
	}
	return nil
}

// change makes the i-th change between two dumps: the ballast's SIGUSR2
// and its line saying it is made; for the oracle, ten more ticks (a second
// at its 100 ms tick).
func change(sb *executor.Sandbox, spec executor.Spec, stdout string, i int) error {
	if spec.Network == unit.Loopback {
		var last float64
		data, _ := os.ReadFile(stdout)
		for _, l := range bytes.Split(data, []byte("\n")) {
			var m map[string]any
			if json.Unmarshal(l, &m) == nil {
				c, _ := m["counter"].(float64)
				last = max(last, c)
			}
		}
		_, err := waitLine(stdout, func(m map[string]any) bool { c, _ := m["counter"].(float64); return c >= last+10 })
		return err
	}
	if err := syscall.Kill(int(sb.Pid()), syscall.SIGUSR2); err != nil {
		return err
	}
	_, err := waitLine(stdout, func(l map[string]any) bool { c, _ := l["changes"].(float64); return int(c) == i })
	return err
}

// waitLine waits for a line of the unit's output that ok accepts.
func waitLine(path string, ok func(map[string]any) bool) (map[string]any, error) {
	deadline := time.Now().Add(120 * time.Second)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(path)
		for _, l := range bytes.Split(data, []byte("\n")) {
			var m map[string]any
			if json.Unmarshal(l, &m) == nil {
				if e, _ := m["error"].(string); e != "" {
					return nil, fmt.Errorf("the unit reports: %s", e)
				}
				if ok(m) {
					return m, nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("no such line in %s", path)
}
