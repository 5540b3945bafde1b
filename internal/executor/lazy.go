//go:build linux

package executor

// Issue 15's lazy image resume (docs/lazy-resume.md): a restore whose
// memory arrives on fault and in the background from a `criu lazy-pages`
// daemon. The image form calls it when the daemon runs with
// --lazy-resume (internal/forms, lazy.go); bench/lazybench measures it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/failpoint"
	"golang.org/x/sys/unix"
)

// ErrPagesLost is a lazy restore whose lazy-pages daemon ended before
// every page was resident: the pages it had not served are gone from the
// unit (the kernel fills them with zeros once the userfaultfd closes), so
// the unit must not go on.
var ErrPagesLost = errors.New("executor: lazy pages lost before every page was resident")

// ErrPagesArriving is a checkpoint asked of a sandbox whose lazy restore
// is still bringing its pages in, served by a lazy-pages this process did
// not start (an earlier daemon process's): a dump now would leave the
// missing pages out. It passes once that lazy-pages has exited.
var ErrPagesArriving = errors.New("executor: a lazy restore's pages are still arriving")

// lazyLog is the lazy-pages daemon's log, in the restore's work directory.
const lazyLog = "lazy-pages.log"

// lazyPid names the pid of a sandbox's lazy-pages, in STATE/criu/ID.
const lazyPid = "lazy-pages.pid"

// LazyRestoring reports whether sandbox id's lazy restore is still
// serving pages: its lazy-pages (by the pid it left, checked against a
// reused pid as killLazyLeftovers checks it) is alive. A restarted daemon
// asks it before a park of a unit it found.
func (c *Client) LazyRestoring(id string) bool {
	pidFile, file, want := c.lazyPagesRecord(id)
	pid := readPid(pidFile)
	return pid > 0 && isRecorded(pid, file, want)
}

// LazyUnfinished reports whether sandbox id was restored lazily and its
// lazy-pages was not seen to bring every page in: the restore recorded
// its pid, and only a clean exit that a daemon saw removes it. A
// restarted daemon that finds it parks the run back at its snapshot: it
// cannot tell what the unit read while no daemon watched its pages.
func (c *Client) LazyUnfinished(id string) bool {
	pidFile, _, _ := c.lazyPagesRecord(id)
	_, err := os.Lstat(pidFile)
	return err == nil
}

// LazyPages is the `criu lazy-pages` daemon of one lazy restore. It serves
// the unit's lazy pages (anonymous private memory) from the image
// directory as the unit faults on them, pushes the rest in the background
// once the restore has finished, and exits when every page is resident.
type LazyPages struct {
	cmd   *exec.Cmd
	start time.Time
	done  chan struct{}
	log   string
	// server is the page server process serving lazy-pages, nil when
	// lazy-pages reads the image directory itself; its log is serverLog.
	server    *exec.Cmd
	serverLog string
	// held is the pipe that tells the page server whether the unit's
	// userfaultfds are held (sayHeld, letGo); tasks is how many
	// userfaultfds lazy-pages holds once it has every task's: the
	// extent table's Uffds, or its tasks if more (0 without a server).
	held     *os.File
	heldOnce sync.Once
	tasks    int
	// recorded is the sandbox's CRIU directory where its pids are
	// recorded (recordLazyPids): a clean exit removes them there.
	recorded string

	mu       sync.Mutex
	err      error         // set before done closes
	resident time.Duration // from the daemon's start to its exit
	exited   time.Time
}

// Done is closed when the daemon has exited.
func (l *LazyPages) Done() <-chan struct{} { return l.done }

// Pid is the daemon's process id.
func (l *LazyPages) Pid() int { return l.cmd.Process.Pid }

// Result is, once Done is closed, how long every page took to be resident
// (from the daemon's start) and nil, or an error wrapping [ErrPagesLost]
// with the tail of its log.
func (l *LazyPages) Result() (time.Duration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.resident, l.err
}

// ExitedAt is, once Done is closed, when the daemon exited.
func (l *LazyPages) ExitedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.exited
}

// Kill ends the daemon (a lazy restore's failure path; and the bench's
// experiment of a daemon that dies mid-way) and waits for it.
func (l *LazyPages) Kill() {
	l.letGo()
	_ = l.cmd.Process.Kill()
	if l.server != nil {
		_ = l.server.Process.Kill()
	}
	<-l.done
}

// HoldUffds takes a copy (pidfd_getfd) of every userfaultfd the daemon
// holds, one per restored task (the CRIU deploy/setup.sh builds keeps a
// task's until every task's pages are in), and returns how many and how
// to close them. While a copy is open the kernel keeps the unit's lazy ranges
// registered: if the daemon dies, a fault on a page it had not served
// waits (the faulting thread sleeps in handle_userfault until it is
// killed) instead of being filled with zeros once the last copy closes.
// Take the copies as soon as the restore returns (the daemon has them by
// then) and close them only after the unit is frozen or dead, or after
// every page is resident. A lazy-pages that has already exited (every
// page in) leaves none to take, which is no error. A page server is told
// when the copies are taken, and again when release lets them go (or
// that none are held, should fewer be found than the tasks it serves,
// within uffdWait): it hangs up on a failure only while they are held
// (pageserver.Server.Hold).
func (l *LazyPages) HoldUffds() (n int, release func(), err error) {
	defer func() {
		if err != nil || n == 0 || n < l.tasks {
			l.letGo()
			return
		}
		l.sayHeld()
		copies := release
		release = func() { l.letGo(); copies() }
	}()
	pid := l.Pid()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return l.gone(fmt.Errorf("pidfd of criu lazy-pages: %w", err))
	}
	defer unix.Close(pidfd)
	fds, err := uffdsOf(pid, l.tasks)
	if err != nil {
		return l.gone(err)
	}
	var held []int
	release = func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}
	for _, n := range fds {
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			// lazy-pages may have exited since it was listed, its
			// every page in.
			release()
			return l.gone(fmt.Errorf("userfaultfd %d of criu lazy-pages: %w", n, err))
		}
		if !isUserfaultfd(fd) {
			// The number was closed and reused since it was listed:
			// not a copy to count (fewer than the tasks: not held).
			unix.Close(fd)
			continue
		}
		held = append(held, fd)
	}
	return len(held), release, nil
}

// isUserfaultfd reports whether this process's descriptor fd is a
// userfaultfd.
func isUserfaultfd(fd int) bool {
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	return err == nil && target == uffdLink
}

// uffdLink is what /proc/PID/fd/N links to for a userfaultfd.
const uffdLink = "anon_inode:[userfaultfd]"

// uffdWait bounds HoldUffds' wait for a served lazy-pages to hold every
// task's userfaultfd: CRIU's restore sends them as it restores the tasks
// and returns without waiting for lazy-pages to have received them.
const uffdWait = 2 * time.Second

// uffdsOf is the descriptors of process pid that are userfaultfds, once
// there are want of them or uffdWait has passed.
func uffdsOf(pid, want int) ([]int, error) {
	deadline := time.Now().Add(uffdWait)
	for {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			return nil, err
		}
		var fds []int
		for _, e := range ents {
			target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
			if err == nil && target == uffdLink {
				n, _ := strconv.Atoi(e.Name())
				fds = append(fds, n)
			}
		}
		if len(fds) >= want || time.Now().After(deadline) {
			return fds, nil
		}
		time.Sleep(time.Millisecond)
	}
}

// CheckLazy asks CRIU whether this host can restore lazily: `criu check
// --feature uffd-noncoop` (userfaultfd with the events a lazy restore of
// a process tree needs). A daemon started with lazy resume refuses to
// start where it cannot.
func (c *Client) CheckLazy(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, c.cfg.CRIU, "check", "--feature", "uffd-noncoop").CombinedOutput()
	if err != nil {
		return fmt.Errorf("executor: criu check --feature uffd-noncoop: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startLazyPages starts `criu lazy-pages` on images, with work as its work
// directory: it listens on work/lazy-pages.socket (a relative name, so no
// sun_path limit), where CRIU's restore, whose working directory is the
// same work directory, connects. It returns once the daemon says it is
// listening (--status-fd), or an error within wait.
func (c *Client) startLazyPages(images, work string, pages *pageserver.Table, wait time.Duration) (*LazyPages, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	defer w.Close()
	cmd := exec.Command(c.cfg.CRIU, "lazy-pages", "--images-dir", images, "--work-dir", work,
		"--log-file", lazyLog, "-v4", "--status-fd", "3")
	cmd.ExtraFiles = []*os.File{w}
	// Its own session: a signal to the daemon's process group is not for
	// it, and it outlives the daemon (the unit needs it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	l := &LazyPages{cmd: cmd, start: time.Now(), done: make(chan struct{}), log: filepath.Join(work, lazyLog)}
	if pages != nil {
		conn, err := l.startServer(pages, work)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		l.tasks = max(len(pages.Tasks), pages.Uffds)
		cmd.Args = append(cmd.Args, "--page-server", "--ps-socket", "4")
		cmd.ExtraFiles = append(cmd.ExtraFiles, conn)
	}
	if err := cmd.Start(); err != nil {
		l.letGo()
		if l.server != nil {
			_ = l.server.Process.Kill()
			_ = l.server.Wait()
		}
		return nil, fmt.Errorf("criu lazy-pages: %w", err)
	}
	w.Close()
	go l.wait()
	ready := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		_, err := r.Read(b)
		ready <- err
	}()
	select {
	case err := <-ready:
		if err == nil {
			return l, nil
		}
		<-l.done
		_, lerr := l.Result()
		return nil, fmt.Errorf("criu lazy-pages did not start: %w", lerr)
	case <-time.After(wait):
		l.Kill()
		return nil, fmt.Errorf("criu lazy-pages did not listen within %s", wait)
	}
}

func (l *LazyPages) wait() {
	err := l.cmd.Wait()
	exited := time.Now()
	l.letGo() // nothing left to hold
	var serr error
	if l.server != nil {
		// lazy-pages gone, its end of the socket closes: the server
		// ends too, and says why it hung up first if it did.
		serr = l.waitServer()
	}
	l.mu.Lock()
	l.exited = exited
	l.resident = l.exited.Sub(l.start)
	switch {
	case serr != nil:
		l.err = fmt.Errorf("%w: %w (criu lazy-pages: %v)%s", ErrPagesLost, serr, err, logTail(l.log))
	case err != nil:
		l.err = fmt.Errorf("%w: criu lazy-pages: %w%s", ErrPagesLost, err, logTail(l.log))
	default:
		// Every page resident, and seen to be: the restore is finished
		// for a restarted daemon too (LazyUnfinished). Not removed, the
		// pids cost only a park back should the daemon restart first.
		_ = unrecordLazyPids(l.recorded)
	}
	l.mu.Unlock()
	close(l.done)
}

// RestoreLazy is [Client.Restore] with lazy pages: it returns as soon as
// the unit runs, its registers, files, sockets and eager memory (file
// mappings, stacks) restored, with the daemon that serves the rest. The
// caller must keep watching it: an error from [LazyPages.Result] means the
// unit's memory is incomplete, and its sandbox must be destroyed.
//
// The sandbox's CRIU configuration is a file of its own (the
// org.criu.config annotation), criuConfig plus lazy-pages during the
// restore, rewritten to criuConfig once it is done, so that a later dump
// of the sandbox is an ordinary one. (runc restore has --lazy-pages, but
// containerd's runc shim passes no CRIU option to a restore.)
func (c *Client) RestoreLazy(ctx context.Context, id string, spec Spec, cp Checkpoint, out Output) (*Sandbox, *LazyPages, RestoreStats, error) {
	s, l, st, err := c.restoreLazy(ctx, id, spec, cp, out)
	if err != nil {
		return nil, nil, RestoreStats{}, fmt.Errorf("executor: lazy restore %s: %w", id, err)
	}
	return s, l, st, nil
}

func (c *Client) restoreLazy(ctx context.Context, id string, spec Spec, cp Checkpoint, out Output) (*Sandbox, *LazyPages, RestoreStats, error) {
	start := time.Now()
	images, work, err := c.restoreWork(id, cp, spec.UserNS)
	if err != nil {
		return nil, nil, RestoreStats{}, err
	}
	conf := c.sandboxCRIUConfig(id)
	if _, err := writeFileDurably(conf, strings.NewReader(criuConfig+lazyConfigLine)); err != nil {
		return nil, nil, RestoreStats{}, err
	}
	// The image directory itself: a staged one's pages are detached
	// once the restore returns (unstage).
	orig, err := filepath.Abs(cp.ImageDir)
	if err != nil {
		return nil, nil, RestoreStats{}, err
	}
	l, err := c.startLazyPages(orig, work, cp.Pages, 10*time.Second)
	if err != nil {
		return nil, nil, RestoreStats{}, fmt.Errorf("%w: %w", ErrRestore, err)
	}
	if err := c.recordLazyPids(id, l); err != nil {
		l.Kill()
		return nil, nil, RestoreStats{}, err
	}
	rs := &restoreFrom{images: images, rootfs: cp.Rootfs, work: work, deadline: cp.Deadline, criuConfig: conf}
	s, err := c.create(ctx, id, spec, out, rs)
	unstage(c, id, spec, images)
	if err == nil {
		failpoint.Fire("lazy.restored")
		// Later dumps of this sandbox are eager ones.
		_, err = writeFileDurably(conf, strings.NewReader(criuConfig))
		if err != nil {
			err = errors.Join(err, s.destroy(context.WithoutCancel(ctx)))
		}
	}
	if err != nil {
		l.Kill()
		return nil, nil, RestoreStats{}, restoreFailed(rs, err)
	}
	return s, l, rs.stats(start), nil
}

// lazyConfigLine is what a lazy restore adds to the sandbox's CRIU
// configuration.
const lazyConfigLine = "lazy-pages\n"

// sandboxCRIUConfig is sandbox id's own CRIU configuration file, which a
// lazily restored container's org.criu.config annotation names.
func (c *Client) sandboxCRIUConfig(id string) string {
	return filepath.Join(c.cfg.StateDir, "criu", id, criuConfigName)
}

// repairCRIUConfig makes sandbox id's own CRIU configuration, if it has
// one (a lazily restored sandbox's), the ordinary one: a dump that read
// the lazy-pages line would leave the lazy pages out of the images and
// wait for a page server to take them, until its deadline. The lazy
// restore rewrites the file once it returns; a daemon that crashed before
// that left the line, and every dump repairs it first.
func (c *Client) repairCRIUConfig(id string) error {
	conf := c.sandboxCRIUConfig(id)
	b, err := os.ReadFile(conf)
	if errors.Is(err, os.ErrNotExist) || err == nil && string(b) == criuConfig {
		return nil
	}
	if err == nil {
		_, err = writeFileDurably(conf, strings.NewReader(criuConfig))
	}
	if err != nil {
		return fmt.Errorf("%w: the sandbox's CRIU configuration: %w", ErrCheckpoint, err)
	}
	c.log.Warn("repaired a sandbox's CRIU configuration left as a lazy restore's", "sandbox", id)
	return nil
}

// gone answers HoldUffds for a lazy-pages that could not be looked at
// (err): one that has exited — a small unit's pages can all be in before
// the restore returns — leaves nothing to hold, or answers its failure.
func (l *LazyPages) gone(err error) (int, func(), error) {
	select {
	case <-l.done:
	case <-time.After(5 * time.Second):
		return 0, nil, err // still running, and not to be looked at
	}
	if _, lerr := l.Result(); lerr != nil {
		return 0, nil, lerr
	}
	return 0, func() {}, nil
}
