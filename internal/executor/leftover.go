//go:build linux

package executor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// What a lazy restore leaves running outside the sandbox: its lazy-pages
// and its page server, each in a session of its own so that a daemon that
// stops does not take them along. They end once every page is resident;
// a unit killed before that can leave them waiting for ever — a page
// server that failed while nobody held the unit's userfaultfds answers
// nothing more and keeps its connection (pageserver.Server.Hold), and
// lazy-pages waits for its reply. A destroy kills them (killLazyLeftovers)
// by the pids the restore recorded.

// serverPid names the pid of a sandbox's page server, in STATE/criu/ID.
const serverPid = "page-server.pid"

// serverOf, in a page server's environment, names the work directory of
// the restore it serves: what tells it apart from another process that
// took its pid.
const serverOf = "RUNRECORDD_PAGE_SERVER_OF"

// recordLazyPids writes the pids of l's lazy-pages and page server into
// sandbox id's CRIU directory (LazyRestoring, killLazyLeftovers).
func (c *Client) recordLazyPids(id string, l *LazyPages) error {
	dir := filepath.Join(c.cfg.StateDir, "criu", id)
	l.recorded = dir
	if _, err := writeFileDurably(filepath.Join(dir, lazyPid), strings.NewReader(strconv.Itoa(l.Pid()))); err != nil {
		return err
	}
	if l.server == nil {
		return nil
	}
	_, err := writeFileDurably(filepath.Join(dir, serverPid), strings.NewReader(strconv.Itoa(l.server.Process.Pid)))
	return err
}

// unrecordLazyPids removes, durably, the pids recordLazyPids wrote into
// dir: the processes have exited, every page in. Nothing when dir is
// empty (nothing was recorded).
func unrecordLazyPids(dir string) error {
	if dir == "" {
		return nil
	}
	for _, name := range []string{serverPid, lazyPid} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// killLazyLeftovers kills the lazy-pages and the page server a lazy
// restore of sandbox id left, if they still run: each found by its
// recorded pid and checked, once a pidfd holds it, to be that process
// still (lazy-pages by its command line, the server by its environment;
// both naming the restore's work directory). Call it once the unit is
// dead: its pages are of no use any more.
func (c *Client) killLazyLeftovers(id string) {
	killRecorded(c.lazyPagesRecord(id))
	dir := filepath.Join(c.cfg.StateDir, "criu", id)
	killRecorded(filepath.Join(dir, serverPid), "environ", []string{"\x00" + serverOf + "=" + filepath.Join(dir, "restore") + "\x00"})
}

// lazyPagesRecord is where sandbox id's restore records its lazy-pages'
// pid, the /proc file that names it, and what that file holds: lazy-pages'
// command and the restore's work directory, as whole arguments.
func (c *Client) lazyPagesRecord(id string) (pidFile, file string, want []string) {
	dir := filepath.Join(c.cfg.StateDir, "criu", id)
	return filepath.Join(dir, lazyPid), "cmdline", []string{"\x00lazy-pages\x00", "\x00" + filepath.Join(dir, "restore") + "\x00"}
}

// killRecorded SIGKILLs the process whose pid file pidFile holds when it
// runs in this process's pid namespace (a unit's processes, whose command
// line and environment the unit writes, run in their sandbox's) and its
// /proc file (cmdline or environ, read with a NUL before it) holds every
// string of want.
func killRecorded(pidFile, file string, want []string) bool {
	pid := readPid(pidFile)
	if pid <= 0 {
		return false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	// Checked once the pidfd holds the process: a pid reused before it
	// fails the check, and one reused after cannot be signalled.
	return isRecorded(pid, file, want) && unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
}

// readPid is the pid pid file pidFile holds; 0 without one.
func readPid(pidFile string) int {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// isRecorded reports whether process pid runs in this process's pid
// namespace and its /proc file (read with a NUL before it) holds every
// string of want.
func isRecorded(pid int, file string, want []string) bool {
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return false
	}
	if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || ns != own {
		return false
	}
	got, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return false
	}
	got = append([]byte{0}, got...)
	for _, w := range want {
		if !bytes.Contains(got, []byte(w)) {
			return false
		}
	}
	return true
}
