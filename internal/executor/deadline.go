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
	"time"

	"golang.org/x/sys/unix"
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

// underDeadline runs call; once d has passed (d > 0), or ctx is done, it
// kills the helper processes of sandbox id's shim — every descendant
// except the process tree rooted at the pid keep returns (0: none kept) —
// until call returns. It reports whether it had to kill. call runs with a
// context that is never cancelled: cancelling it would end runc, not the
// CRIU holding the unit, so a cancelled request is ended by the kill too.
func (c *Client) underDeadline(ctx context.Context, id string, d time.Duration, keep func() int, call func(context.Context) error) (bool, error) {
	return c.underDeadlineIn(ctx, shimOf{c.cfg.Namespace, id}, d, keep, call)
}

// freezeThenKill freezes sandbox id's cgroup and then kills the helpers of
// its shim but the unit's tree (rooted at keep). A CRIU killed in the
// middle of a dump lets the unit go with its TCP sockets still in repair
// mode (reads and writes fail with EPERM): frozen first, the unit cannot
// touch them before releaseCRIU has taken them out of it.
func (c *Client) freezeThenKill(id string, keep int) ([]int, error) {
	procs, err := c.helpers(c.cfg.Namespace, id, keep)
	if err != nil || len(procs) == 0 {
		return nil, err
	}
	if err := c.setFreezer(id, true); err != nil {
		c.log.Warn("freezing the unit before killing CRIU", "sandbox", id, "err", err)
	}
	return c.killHelpers(c.cfg.Namespace, id, keep)
}

// shimOf names the shim of a sandbox: its containerd namespace and id.
type shimOf struct{ ns, id string }

// underDeadlineIn is underDeadline for the sandbox whose shim is shim, in
// any containerd namespace.
func (c *Client) underDeadlineIn(ctx context.Context, shim shimOf, d time.Duration, keep func() int, call func(context.Context) error) (bool, error) {
	ns, id := shim.ns, shim.id
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(callCtx) }()
	var expired <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	why := "deadline passed"
	select {
	case err := <-done:
		return false, err
	case <-expired:
	case <-ctx.Done():
		why = "request cancelled"
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	grace := time.NewTimer(killGrace)
	defer grace.Stop()
	kill := func() ([]int, error) { return c.killHelpers(ns, id, keep()) }
	if ns == c.cfg.Namespace && keep() != 0 {
		kill = func() ([]int, error) { return c.freezeThenKill(id, keep()) }
	}
	for {
		if pids, err := kill(); err != nil {
			c.log.Warn("killing CRIU", "sandbox", id, "why", why, "err", err)
		} else if len(pids) > 0 {
			// A cancelled request is the caller's choice (a client gone,
			// a daemon shutting down); a deadline passed is news.
			logf := c.log.Warn
			if why == "request cancelled" {
				logf = c.log.Info
			}
			logf("CRIU "+why+": killed the shim's helpers", "sandbox", id, "deadline", d, "pids", pids)
		}
		select {
		case err := <-done:
			if err == nil && ctx.Err() != nil {
				err = ctx.Err()
			}
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
//
// A unit can give its processes any command line, so the shim must also
// be in this process's pid namespace (a unit's processes are in their
// sandbox's). Each process is killed through a pidfd opened after the scan
// and checked to still have the parent the scan found, so that a pid the
// kernel reused in between is never hit.
func (c *Client) killHelpers(ns, id string, keep int) ([]int, error) {
	targets, err := c.helpers(ns, id, keep)
	if err != nil {
		return nil, err
	}
	var killed []int
	for _, t := range targets {
		if killChild(t.pid, t.ppid) {
			killed = append(killed, t.pid)
		}
	}
	return killed, nil
}

type target struct{ pid, ppid int }

// helpers lists the descendants of the shim of sandbox id (in containerd
// namespace ns) outside the tree rooted at keep, deepest first.
func (c *Client) helpers(ns, id string, keep int) ([]target, error) {
	procs, err := processes()
	if err != nil {
		return nil, err
	}
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return nil, err
	}
	shim := c.findShim(procs, ns, id, own)
	if shim == 0 {
		return nil, nil
	}
	children := childrenOf(procs)
	var out []target
	var walk func(pid int)
	walk = func(parent int) {
		for _, ch := range children[parent] {
			if ch == keep {
				continue
			}
			walk(ch)
			out = append(out, target{ch, parent})
		}
	}
	walk(shim)
	return out, nil
}

// killChild SIGKILLs pid if it is still parent's child, through a pidfd.
func killChild(pid, parent int) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	// The pidfd names one process for good; this is still the one the
	// scan found if it still has that parent.
	if p, ok := readStat(pid); !ok || p.ppid != parent {
		return false
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
}

// findShim returns the pid of the shim of sandbox id in namespace ns
// among procs, 0 if there is none. With pidns set, only a shim in that pid
// namespace counts.
func (c *Client) findShim(procs map[int]proc, ns, id, pidns string) int {
	for pid, p := range procs {
		if !strings.HasPrefix(p.comm, "containerd-shim") || !c.isShimOf(cmdline(pid), ns, id) {
			continue
		}
		if pidns == "" {
			return pid
		}
		if got, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && got == pidns {
			return pid
		}
	}
	return 0
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
	comm string
}

// processes reads every process's parent and command name from /proc.
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
		if p, ok := readStat(pid); ok {
			out[pid] = p
		}
	}
	return out, nil
}

// childrenOf maps each pid of procs to its children's.
func childrenOf(procs map[int]proc) map[int][]int {
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	return children
}

// readStat reads pid's command name and parent from /proc/PID/stat.
func readStat(pid int) (proc, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return proc{}, false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i, j := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if i < 0 || j < i {
		return proc{}, false
	}
	f := strings.Fields(string(stat[j+1:]))
	if len(f) < 2 {
		return proc{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return proc{}, false
	}
	return proc{ppid: ppid, comm: string(stat[i+1 : j])}, true
}

// cmdline is pid's command line (nil once it has exited).
func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// timeoutErr is the error of an operation whose deadline passed.
func timeoutErr(sentinel error, d time.Duration, err error) error {
	if err == nil {
		err = errors.New("it returned no error")
	}
	return fmt.Errorf("%w: CRIU was killed after %v (%w)", sentinel, d, err)
}

// reapShim waits, up to d, for the shim of sandbox id in namespace ns to
// exit after its container was deleted, and kills it if it has not: a
// shim exits on its own once its last container is gone, but a daemon
// that stops right after leaves one still exiting, or one a cancelled
// start left unable to answer, behind its containerd.
func (c *Client) reapShim(ns, id string, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		procs, err := processes()
		if err != nil {
			return
		}
		shim := c.findShim(procs, ns, id, "")
		if shim == 0 {
			return
		}
		if time.Now().After(deadline) {
			if fd, err := unix.PidfdOpen(shim, 0); err == nil {
				if c.isShimOf(cmdline(shim), ns, id) {
					_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
					c.log.Info("probe: killed a shim that outlived its container", "id", id, "pid", shim)
				}
				unix.Close(fd)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
