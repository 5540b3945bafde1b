//go:build linux

package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProbeProcess dumps a sleeping process of its own with the criu binary
// bin and restores it, each step under deadline, working in dir (which it
// fills, and the caller removes); it returns CRIU's logs.
func ProbeProcess(ctx context.Context, bin, dir string, deadline time.Duration) (logs []byte, err error) {
	criu, err := exec.LookPath(bin)
	if err != nil {
		return nil, err
	}
	images, work := filepath.Join(dir, "images"), filepath.Join(dir, "work")
	for _, d := range []string{images, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	defer func() { logs = ReadLogs(filepath.Join(work, "dump.log"), filepath.Join(work, "restore.log")) }()

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
			return fmt.Errorf("process probe: criu %s did not finish within %v and was killed%s", what, deadline, LogTail(filepath.Join(work, what+".log")))
		}
		if err != nil {
			return fmt.Errorf("process probe: criu %s: %v: %s%s", what, err, bytes.TrimSpace(out), LogTail(filepath.Join(work, what+".log")))
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
