//go:build linux

package pageserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// What a lazy restore leaves running outside the sandbox: its lazy-pages
// and its page server, each in a session of its own so that a daemon that
// stops does not take them along. They end once every page is resident;
// a unit killed before that can leave them waiting for ever — a page
// server that failed while nobody held the unit's userfaultfds answers
// nothing more and keeps its connection ([Server.Hold]), and lazy-pages
// waits for its reply. A destroy kills them ([Pids.KillLeftovers]) by the
// pids the restore recorded.

// Pids is where a sandbox's lazy restore records the pids of its
// lazy-pages and page server: Dir, the sandbox's CRIU directory; and the
// restore's work directory Work, which both processes name (lazy-pages in
// its command line, the server in its environment), so that a process
// that took a recorded pid is told apart.
type Pids struct{ Dir, Work string }

// lazyPid and serverPid name the pid files in Pids.Dir.
const (
	lazyPid   = "lazy-pages.pid"
	serverPid = "page-server.pid"
)

// serverOf, in a page server's environment, names the work directory of
// the restore it serves: what tells it apart from another process that
// took its pid.
const serverOf = "RUNRECORDD_PAGE_SERVER_OF"

// residentAt names, in Pids.Dir, when a settled lazy restore's lazy-pages
// exited cleanly (Unix nanoseconds): [Pids.Settled].
const residentAt = "lazy-pages.resident"

// Record writes the pids of l's lazy-pages and page server, durably; l's
// clean exit, once the unit is settled (SetUnit), writes when it exited
// and removes them. A restore settled already leaves none to record: only
// when it exited.
func (p Pids) Record(l *LazyPages) error {
	l.mu.Lock() // against l.wait's removal
	defer l.mu.Unlock()
	if err := os.Remove(filepath.Join(p.Dir, residentAt)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err // an earlier restore's
	}
	if l.clean && l.unit != 0 {
		return (&p).settled(l.exited) // settled (or settling): nothing to record
	}
	l.recorded = &p
	if err := writePid(filepath.Join(p.Dir, lazyPid), l.Pid()); err != nil {
		return err
	}
	if l.server == nil {
		return nil
	}
	return writePid(filepath.Join(p.Dir, serverPid), l.server.Process.Pid)
}

func writePid(path string, pid int) error {
	return atomicfile.Write(path, 0o600, func(f *os.File) error {
		_, err := f.WriteString(strconv.Itoa(pid))
		return err
	})
}

// settled writes, durably, when lazy-pages exited, every page in and the
// unit settled, then removes the pids Record wrote (remove): a daemon that
// dies before journaling it leaves it for the next ([Pids.Settled]).
// Nothing when p is nil (nothing was recorded).
func (p *Pids) settled(exited time.Time) error {
	if p == nil {
		return nil
	}
	err := atomicfile.Write(filepath.Join(p.Dir, residentAt), 0o600, func(f *os.File) error {
		_, err := f.WriteString(strconv.FormatInt(exited.UnixNano(), 10))
		return err
	})
	if err != nil {
		return err
	}
	return p.remove()
}

// Settled is when the sandbox's lazy restore was settled (its lazy-pages'
// clean exit, every page in), as the daemon that saw it wrote it: what a
// restarted daemon journals as resident when that daemon did not.
func (p Pids) Settled() (time.Time, bool) {
	b, err := os.ReadFile(filepath.Join(p.Dir, residentAt))
	if err != nil {
		return time.Time{}, false
	}
	ns, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || ns <= 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// remove removes, durably, the pids Record wrote: the processes have
// exited, every page in. Nothing when p is nil (nothing was recorded).
func (p *Pids) remove() error {
	if p == nil {
		return nil
	}
	for _, name := range []string{serverPid, lazyPid} {
		if err := os.Remove(filepath.Join(p.Dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return atomicfile.SyncDir(p.Dir)
}

// Forget removes, durably, the pids Record wrote, once both processes
// have ended: a restore that failed ([LazyPages.Kill]).
func (p Pids) Forget() error { return (&p).remove() }

// Serving reports whether the lazy restore is still serving pages: its
// recorded lazy-pages (checked against a reused pid as KillLeftovers
// checks it) is alive. A restarted daemon asks it before a park of a
// unit it found.
func (p Pids) Serving() bool {
	pidFile, file, want := p.lazyPages()
	pid := readPid(pidFile)
	return pid > 0 && isRecorded(pid, file, want)
}

// Unfinished reports whether the sandbox was restored lazily and its
// lazy-pages was not seen to bring every page in: the restore recorded
// its pid, and only a clean exit that a daemon saw removes it. A
// restarted daemon that finds it parks the run back at its snapshot: it
// cannot tell what the unit read while no daemon watched its pages.
func (p Pids) Unfinished() bool {
	_, err := os.Lstat(filepath.Join(p.Dir, lazyPid))
	return err == nil
}

// KillLeftovers kills the lazy-pages and the page server the lazy restore
// left, if they still run: each found by its recorded pid and checked,
// once a pidfd holds it, to be that process still (lazy-pages by its
// command line, the server by its environment; both naming Work). Call it
// once the unit is dead: its pages are of no use any more.
func (p Pids) KillLeftovers() {
	killRecorded(p.lazyPages())
	killRecorded(filepath.Join(p.Dir, serverPid), "environ", []string{"\x00" + serverOf + "=" + p.Work + "\x00"})
}

// lazyPages is where lazy-pages' pid is recorded, the /proc file that
// names it, and what that file holds: lazy-pages' command and the
// restore's work directory, as whole arguments.
func (p Pids) lazyPages() (pidFile, file string, want []string) {
	return filepath.Join(p.Dir, lazyPid), "cmdline", []string{"\x00lazy-pages\x00", "\x00" + p.Work + "\x00"}
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
