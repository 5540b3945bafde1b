//go:build linux

package pageserver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// KillLeftovers kills the lazy-pages and page server the sandbox's
// restore recorded, and nothing else: not a process that took a recorded
// pid without being one of them.
func TestKillLeftovers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sb")
	work := filepath.Join(dir, "restore")
	c := Pids{Dir: dir, Work: work}
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	// cat reading a pipe held open: a process that waits, forks nothing,
	// and carries the arguments it is given.
	start := func(cmd *exec.Cmd) *exec.Cmd {
		if cmd.Stdin == nil {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close(); w.Close() })
			cmd.Stdin = r
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	// Stand-ins, named as the real ones are: lazy-pages by its command
	// line, the server by its environment.
	lazy := start(exec.Command("cat", "-", "lazy-pages", work))
	server := exec.Command("sleep", "100")
	server.Env = append(os.Environ(), serverOf+"="+work)
	start(server)
	record := func(name string, cmd *exec.Cmd) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// First as pids another sandbox's restore recorded: neither names
	// this one's work directory.
	odir := filepath.Join(t.TempDir(), "sb")
	other := Pids{Dir: odir, Work: filepath.Join(odir, "restore")}
	if err := os.MkdirAll(odir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, cmd := range map[string]*exec.Cmd{lazyPid: lazy, serverPid: server} {
		if err := os.WriteFile(filepath.Join(odir, name), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	other.KillLeftovers()
	time.Sleep(50 * time.Millisecond)
	for _, cmd := range []*exec.Cmd{lazy, server} {
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("%s was killed for another sandbox: %v", cmd.Path, err)
		}
	}
	// Then as a process of another pid namespace (a unit's) named as
	// lazy-pages is: left alone.
	ns := start(exec.Command("unshare", "--pid", "--fork", "--kill-child", "--", "cat", "-", "lazy-pages", work))
	inner := childOf(t, ns.Process.Pid)
	t.Cleanup(func() { _ = syscall.Kill(inner, syscall.SIGKILL) })
	if err := os.WriteFile(filepath.Join(dir, lazyPid), []byte(strconv.Itoa(inner)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.KillLeftovers()
	time.Sleep(50 * time.Millisecond)
	if err := syscall.Kill(inner, 0); err != nil {
		t.Fatalf("a process of another pid namespace was killed: %v", err)
	}
	record(lazyPid, lazy)
	record(serverPid, server)
	c.KillLeftovers()
	for _, cmd := range []*exec.Cmd{lazy, server} {
		err := cmd.Wait()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("%s: %v, want killed", cmd.Path, err)
		}
	}
}

// A copy HoldUffds takes counts only if it is a userfaultfd: the number
// it listed may have been closed and reused in between.
func TestIsUserfaultfd(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if isUserfaultfd(int(r.Fd())) {
		t.Fatal("a pipe taken for a userfaultfd")
	}
	fd, _, errno := syscall.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		t.Fatalf("userfaultfd: %v", errno)
	}
	defer unix.Close(int(fd))
	if !isUserfaultfd(int(fd)) {
		t.Fatal("a userfaultfd not taken for one")
	}
}

// childOf is the one child of process pid, waited for.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	for range 200 {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if f := strings.Fields(string(b)); len(f) == 1 {
			n, _ := strconv.Atoi(f[0])
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d has no child", pid)
	return 0
}
