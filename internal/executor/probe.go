//go:build linux

package executor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// breakpointsOff is what CRIU ≥ 4.2 logs when a machine's hardware
// breakpoints do not fire (some virtual machines); it then goes on without
// them, where 4.1 waited forever.
const breakpointsOff = "Hardware breakpoints don't seem to work"

// Probe dumps and restores a throwaway process with the criu binary, then
// a throwaway container through containerd (runc and CRIU, as a park and a
// resume do), each step under deadline. Everything it makes is removed.
func (c *Client) Probe(ctx context.Context, deadline time.Duration) criu.Probe {
	start := time.Now()
	var p criu.Probe
	logs, err := c.probeProcess(ctx, deadline)
	if err == nil {
		var clogs []byte
		clogs, err = c.probeContainer(ctx, deadline, nil)
		logs = append(logs, clogs...)
	}
	if err == nil && c.cfg.ProbeUserNS != nil {
		// Its logs are not searched for the build's capabilities:
		// those of the plain container say it.
		_, uerr := c.probeContainer(ctx, deadline, c.cfg.ProbeUserNS)
		p.UserNSTried, p.UserNS = true, uerr == nil
		if uerr != nil {
			p.UserNSReason = uerr.Error()
		}
	}
	if bytes.Contains(logs, []byte(breakpointsOff)) {
		p.Notes = append(p.Notes, "CRIU works with hardware breakpoints off (they do not fire on this machine)")
	}
	p.Seen = seenInLogs(logs)
	p.OK = err == nil
	if err != nil {
		p.Reason = err.Error()
	}
	p.Took = time.Since(start)
	return p
}

// probeDir makes a fresh directory for one probe under the executor's
// state.
func (c *Client) probeDir() (string, string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := "probe-" + hex.EncodeToString(b[:])
	dir := filepath.Join(c.cfg.StateDir, "probe", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	return id, dir, nil
}

// probeProcess dumps a sleeping process of its own with criu and restores
// it; it returns CRIU's logs.
func (c *Client) probeProcess(ctx context.Context, deadline time.Duration) (logs []byte, err error) {
	criu, err := exec.LookPath(c.cfg.CRIU)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMissing, err)
	}
	_, dir, err := c.probeDir()
	if err != nil {
		return nil, err
	}
	defer removeTree(dir)
	images, work := filepath.Join(dir, "images"), filepath.Join(dir, "work")
	for _, d := range []string{images, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	defer func() { logs = readLogs(filepath.Join(work, "dump.log"), filepath.Join(work, "restore.log")) }()

	sleep := exec.Command("sleep", "600")
	sleep.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleep.Start(); err != nil {
		return nil, fmt.Errorf("process probe: %w", err)
	}
	pid := sleep.Process.Pid
	exited := make(chan struct{})
	go func() { _ = sleep.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default: // the dump failed: the original is still there
			_ = syscall.Kill(pid, syscall.SIGKILL)
			<-exited
		}
	}()
	run := func(what string, args ...string) error {
		ctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		cmd := exec.CommandContext(ctx, criu, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		out, err := cmd.CombinedOutput()
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("process probe: criu %s did not finish within %v and was killed%s", what, deadline, logTail(filepath.Join(work, what+".log")))
		}
		if err != nil {
			return fmt.Errorf("process probe: criu %s: %v: %s%s", what, err, bytes.TrimSpace(out), logTail(filepath.Join(work, what+".log")))
		}
		return nil
	}
	if err := run("dump", "dump", "-t", strconv.Itoa(pid), "-D", images, "-W", work, "-o", "dump.log", "-v4"); err != nil {
		return nil, err
	}
	select {
	case <-exited: // the dump ended it, and it is reaped: its pid is free
	case <-time.After(deadline):
		return nil, errors.New("process probe: the dumped process did not exit")
	}
	pidfile := filepath.Join(dir, "restored.pid")
	if err := run("restore", "restore", "-D", images, "-W", work, "-o", "restore.log", "-v4", "-d", "--pidfile", pidfile); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return nil, fmt.Errorf("process probe: %w", err)
	}
	if got, _ := strconv.Atoi(strings.TrimSpace(string(b))); got != pid {
		return nil, fmt.Errorf("process probe: restored as pid %d, dumped as %d", got, pid)
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !bytes.HasPrefix(cmdline, []byte("sleep\x00600")) {
		return nil, fmt.Errorf("process probe: pid %d is not the restored process (%q, %v)", pid, cmdline, err)
	}
	// The restored process is nobody's child here (restore -d): killed,
	// it is reaped by init.
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return nil, nil
}

// readLogs reads CRIU's logs (a file that is not there is skipped).
func readLogs(paths ...string) []byte {
	var out []byte
	for _, p := range paths {
		b, _ := os.ReadFile(p)
		out = append(out, b...)
	}
	return out
}
