//go:build linux

package executor

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Create makes sandbox id from spec as Start does — the same checks, the
// same container, limits, mounts, network namespace and output — but
// only creates its task: runc has set up the container and its init
// waits to run the unit's process until [Sandbox.Begin]. A warm sandbox
// (internal/warmpool, docs/warm-pool.md) is one, made ahead of a resume.
// A sandbox created and never begun is removed by Destroy as any other.
func (c *Client) Create(ctx context.Context, id string, spec Spec, out Output) (*Sandbox, error) {
	if c.gate != "" && spec.withDefaults().Pids >= gateMinPids {
		return c.createGated(ctx, id, spec, out)
	}
	s, err := c.build(ctx, id, spec, out, buildOpts{})
	if err != nil {
		return nil, fmt.Errorf("executor: create %s: %w", id, err)
	}
	return s, nil
}

// createGated is Create with a gate (gate.go): the task started, the gate
// waiting for Begin's word before the unit's argv runs.
func (c *Client) createGated(ctx context.Context, id string, spec Spec, out Output) (*Sandbox, error) {
	made := false // the FIFO, made by the spec, once build has checked id and found no such container
	s, err := c.build(ctx, id, spec, out, buildOpts{start: true, extra: c.gateOpts(id, &made)})
	if err != nil {
		if made {
			_ = os.Remove(c.gateFIFO(id))
		}
		return nil, fmt.Errorf("executor: create %s: %w", id, err)
	}
	s.gate = c.gateFIFO(id)
	return s, nil
}

// Begin starts the unit's process in a sandbox [Client.Create] made: what
// Start does after the task's creation, or, gated, the gate's word.
func (s *Sandbox) Begin(ctx context.Context) error {
	s.mu.Lock()
	task, gate := s.task, s.gate
	s.mu.Unlock()
	if gate != "" {
		if err := s.openGate(ctx, gate); err != nil {
			return fmt.Errorf("executor: begin %s: %w", s.id, err)
		}
		s.mu.Lock()
		s.gate = ""
		s.mu.Unlock()
		return nil
	}
	if task == nil {
		return fmt.Errorf("executor: begin %s: %w", s.id, ErrNotFound)
	}
	if err := task.Start(s.c.ctx(ctx)); err != nil {
		return fmt.Errorf("executor: begin %s: %w", s.id, err)
	}
	return nil
}

// Resident is the memory a sandbox holds on the host: its cgroup's (the
// container's processes, a created task's waiting init among them) and
// its shim's resident set, which runs outside the cgroup. A shim not
// found (another containerd's layout) adds nothing, and shim reports it.
func (s *Sandbox) Resident(ctx context.Context) (total uint64, shim bool, _ error) {
	u, err := s.Stats(ctx)
	if err != nil {
		return 0, false, err
	}
	total = u.MemoryBytes
	procs, err := processes()
	if err != nil {
		return total, false, nil
	}
	own, _ := os.Readlink("/proc/self/ns/pid")
	if pid := s.c.findShim(procs, s.c.cfg.Namespace, s.id, own); pid != 0 {
		if rss, ok := rssOf(pid); ok {
			return total + rss, true, nil
		}
	}
	return total, false, nil
}

// rssOf is process pid's resident set (VmRSS), in bytes.
func rssOf(pid int) (uint64, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		return kb << 10, err == nil
	}
	return 0, false
}
