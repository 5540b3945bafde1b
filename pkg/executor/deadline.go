//go:build linux

package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Every CRIU dump and restore runs under a deadline. CRIU can hang where
// the kernel or the machine does not do what it expects (CRIU 4.1.1 waited
// forever, in every dump, on hardware breakpoints that never fire in some
// virtual machines), and containerd's shim waits for it as long as it
// takes. Cancelling the request would not help: the shim would kill runc,
// and CRIU, its child, would go on holding the unit seized. So at the
// deadline the executor kills, itself, what the sandbox's shim runs beside
// the unit — runc and the CRIU it started — and keeps killing until the
// request returns (runc starts CRIU more than once: a version check, then
// the dump).

// killGrace bounds the wait for the request to return once its helpers
// are killed.
const killGrace = 30 * time.Second

// underDeadline runs call; once d has passed (d > 0) it kills the helper
// processes of sandbox id's shim — every descendant except the process
// tree rooted at the pid keep returns (0: none kept) — until call returns.
// It reports whether the deadline passed.
func (c *Client) underDeadline(ctx context.Context, id string, d time.Duration, keep func() int, call func(context.Context) error) (bool, error) {
	return c.underDeadlineIn(ctx, c.cfg.Namespace, id, d, keep, call)
}

// underDeadlineIn is underDeadline for a sandbox in containerd namespace ns.
func (c *Client) underDeadlineIn(ctx context.Context, ns, id string, d time.Duration, keep func() int, call func(context.Context) error) (bool, error) {
	if d <= 0 {
		return false, call(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return false, err
	case <-t.C:
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	grace := time.NewTimer(killGrace)
	defer grace.Stop()
	for {
		if pids, err := c.killHelpers(ns, id, keep()); err != nil {
			c.log.Warn("killing CRIU at its deadline", "sandbox", id, "err", err)
		} else if len(pids) > 0 {
			c.log.Warn("CRIU deadline passed: killed the shim's helpers", "sandbox", id, "deadline", d, "pids", pids)
		}
		select {
		case err := <-done:
			return true, err
		case <-tick.C:
		case <-grace.C:
			cancel()
			return true, fmt.Errorf("the request did not return %v after its helpers were killed", killGrace)
		}
	}
}

// killHelpers SIGKILLs every descendant of the shim of sandbox id (in
// containerd namespace ns) outside the tree rooted at keep, and returns
// their pids.
func (c *Client) killHelpers(ns, id string, keep int) ([]int, error) {
	procs, err := processes()
	if err != nil {
		return nil, err
	}
	shim := 0
	for pid, p := range procs {
		if c.isShimOf(p.args, ns, id) {
			shim = pid
			break
		}
	}
	if shim == 0 {
		return nil, nil
	}
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	var killed []int
	var walk func(pid int)
	walk = func(pid int) {
		for _, ch := range children[pid] {
			if ch == keep {
				continue
			}
			walk(ch)
			if err := syscall.Kill(ch, syscall.SIGKILL); err == nil {
				killed = append(killed, ch)
			}
		}
	}
	walk(shim)
	return killed, nil
}

// isShimOf reports whether args are the command line of the runc shim of
// sandbox id in namespace ns under this client's containerd:
// containerd-shim-runc-v2 -namespace NS -id ID -address ADDR.
func (c *Client) isShimOf(args []string, ns, id string) bool {
	if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
		return false
	}
	flag := func(name string) string {
		for i := 1; i+1 < len(args); i++ {
			if args[i] == name {
				return args[i+1]
			}
		}
		return ""
	}
	return flag("-id") == id && flag("-namespace") == ns && flag("-address") == c.cfg.Address
}

type proc struct {
	ppid int
	args []string
}

// processes reads every process's parent and command line from /proc.
// Processes that exit while it reads are left out.
func processes() (map[int]proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := make(map[int]proc, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 {
			continue
		}
		ppid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out[pid] = proc{ppid: ppid, args: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")}
	}
	return out, nil
}

// timeoutErr is the error of an operation whose deadline passed.
func timeoutErr(sentinel error, d time.Duration, err error) error {
	if err == nil {
		err = errors.New("it returned no error")
	}
	return fmt.Errorf("%w: CRIU was killed after %v (%w)", sentinel, d, err)
}
