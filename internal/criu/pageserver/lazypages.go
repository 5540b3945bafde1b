//go:build linux

package pageserver

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

	"golang.org/x/sys/unix"
)

// ErrPagesLost is a lazy restore whose lazy-pages daemon ended before
// every page was resident: the pages it had not served are gone from the
// unit (the kernel fills them with zeros once the userfaultfd closes), so
// the unit must not go on.
var ErrPagesLost = errors.New("pageserver: lazy pages lost before every page was resident")

// ErrPagesArriving is a checkpoint asked of a sandbox whose lazy restore
// is still bringing its pages in, served by a lazy-pages this process did
// not start (an earlier daemon process's): a dump now would leave the
// missing pages out. It passes once that lazy-pages has exited.
var ErrPagesArriving = errors.New("pageserver: a lazy restore's pages are still arriving")

// lazyLog is the lazy-pages daemon's log, in the restore's work directory.
const lazyLog = "lazy-pages.log"

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
	// endFetches ends the fetches of owed extents under way once the
	// page server is gone (nil: none is owed).
	endFetches context.CancelFunc
	tasks      int
	// recorded is where its pids are recorded ([Pids.Record]): a clean
	// exit removes them there.
	recorded *Pids

	mu       sync.Mutex
	err      error         // set before done closes
	resident time.Duration // from the daemon's start to its exit
	exited   time.Time
	// unit is the unit's first process (SetUnit), in and clean once
	// lazy-pages has exited with every page in: the second of the two
	// unregisters the unit's ranges (UnregisterUnit).
	unit  int
	clean bool
	// copies is what HoldUffds holds.
	copies *held
}

// SetUnit names the restored unit's first process (a host pid): once
// every page is in, the ranges its tasks registered with their own
// userfaultfds are unregistered ([UnregisterUnit]), now if lazy-pages
// has already exited cleanly.
func (l *LazyPages) SetUnit(pid int) {
	l.mu.Lock()
	l.unit = pid
	clean, recorded, exited := l.clean, l.recorded, l.exited
	l.mu.Unlock()
	if clean {
		settle(pid, recorded, exited)
	}
}

// settle ends a lazy restore every page of which is resident, and seen to
// be: the ranges unit's tasks registered with their own userfaultfds are
// unregistered (best effort: a range left costs a wait, never a zero
// page; a task that exited has none), and only then are the pids
// recorded removed (Pids.Unfinished): a daemon that dies in between
// leaves the restore unfinished, and the next start parks the run back
// rather than reattach a unit whose fault on a page not dumped would
// wait for ever. When lazy-pages exited is written first (Pids.Settled).
func settle(unit int, recorded *Pids, exited time.Time) {
	_, _ = UnregisterUnit(unit)
	_ = recorded.settled(exited)
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
// every page is resident. From then on, until lazy-pages exits or the
// copies are let go, a copy is also taken of each userfaultfd it receives
// (a process the unit forks: the kernel gives its userfaultfd to
// lazy-pages alone), within about forkPoll; n counts those taken at once.
// A lazy-pages that has already exited (every
// page in) leaves none to take, which is no error. A page server is told
// when the copies are taken, and again when release lets them go (or
// that none are held, should fewer be found than the tasks it serves,
// within uffdWait): it hangs up on a failure only while they are held
// (Server.Hold).
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
	fds, err := uffdsOf(pid, l.tasks)
	if err != nil {
		unix.Close(pidfd)
		return l.gone(err)
	}
	h := &held{pidfd: pidfd, taken: map[uffdKey]int{}, stop: make(chan struct{}), stopped: make(chan struct{})}
	for _, n := range fds {
		if err := h.take(n); err != nil {
			// lazy-pages may have exited since it was listed, its
			// every page in.
			h.release()
			return l.gone(fmt.Errorf("userfaultfd %d of criu lazy-pages: %w", n, err))
		}
	}
	n = h.count()
	l.mu.Lock()
	l.copies = h
	l.mu.Unlock()
	h.following = true
	go h.follow(pid, l.done)
	return n, h.release, nil
}

// Held is how many userfaultfds of lazy-pages the daemon holds copies
// of: HoldUffds' and each fork's taken since (0 once they are let go).
func (l *LazyPages) Held() int {
	l.mu.Lock()
	h := l.copies
	l.mu.Unlock()
	if h == nil {
		return 0
	}
	return h.count()
}

// forkPoll is how often the held copies look for a userfaultfd lazy-pages
// received since (a fork's: UFFD_EVENT_FORK gives it to the reader
// alone).
const forkPoll = 2 * time.Millisecond

// held is the daemon's copies of lazy-pages' userfaultfds.
type held struct {
	pidfd     int
	following bool          // set before follow starts
	stop      chan struct{} // closed by release
	stopped   chan struct{} // closed when follow returns

	mu sync.Mutex
	// taken is each copy held, by the userfaultfd of lazy-pages' it is
	// of.
	taken    map[uffdKey]int
	released bool
}

// uffdKey names one of lazy-pages' userfaultfds: its descriptor and its
// inode (since Linux 5.12 each userfaultfd has an anonymous inode of its
// own, so a number reused for another is told apart).
type uffdKey struct {
	fd  int
	ino uint64
}

// take copies lazy-pages' descriptor n if it is a userfaultfd not held
// yet; the error is pidfd_getfd's.
func (h *held) take(n int) error {
	fd, err := unix.PidfdGetfd(h.pidfd, n, 0)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if !isUserfaultfd(fd) || unix.Fstat(fd, &st) != nil {
		// The number was closed and reused since it was listed: not a
		// copy to count (fewer than the tasks: not held).
		unix.Close(fd)
		return nil
	}
	k := uffdKey{n, st.Ino}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, known := h.taken[k]; h.released || known {
		unix.Close(fd)
		return nil
	}
	h.taken[k] = fd
	return nil
}

func (h *held) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.taken)
}

// follow takes a copy of each userfaultfd lazy-pages (pid) receives, every
// forkPoll, until it exits (done) or the copies are let go. A fork's is
// then held within about forkPoll of lazy-pages reading the fork. A copy
// of one lazy-pages closed while not exiting (a task of the unit exited:
// its memory is gone) is closed too, so that a unit forking and exiting
// over and over in the lazy window does not run the daemon out of
// descriptors; while lazy-pages exits (killed, or every page in) every
// copy stays.
func (h *held) follow(pid int, done <-chan struct{}) {
	defer close(h.stopped)
	t := time.NewTicker(forkPoll)
	defer t.Stop()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	for {
		select {
		case <-h.stop:
			return
		case <-done:
			return
		case <-t.C:
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		seen := map[uffdKey]bool{}
		for _, e := range ents {
			link := dir + "/" + e.Name()
			if l, err := os.Readlink(link); err != nil || l != uffdLink {
				continue
			}
			var st unix.Stat_t
			n, err := strconv.Atoi(e.Name())
			if err != nil || unix.Stat(link, &st) != nil {
				continue
			}
			k := uffdKey{n, st.Ino}
			seen[k] = true
			h.mu.Lock()
			_, known := h.taken[k]
			h.mu.Unlock()
			if !known {
				_ = h.take(n)
			}
		}
		// Read after the list: a close the list saw was not exit's.
		if exiting(pid) {
			continue
		}
		h.drop(seen)
	}
}

// drop closes the copies of userfaultfds lazy-pages no longer holds
// (those not in seen).
func (h *held) drop(seen map[uffdKey]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return
	}
	for k, fd := range h.taken {
		if !seen[k] {
			unix.Close(fd)
			delete(h.taken, k)
		}
	}
}

// pfExiting is PF_EXITING (include/linux/sched.h): set as a task starts
// to exit, before its descriptors are closed.
const pfExiting = 0x4

// exiting says whether process pid is exiting or gone (or its state
// cannot be read): its flags, the ninth field of /proc/PID/stat.
func exiting(pid int) bool {
	st, err := procStat(pid)
	return err != nil || st.Flags&pfExiting != 0
}

// release stops following and closes every copy.
func (h *held) release() {
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return
	}
	h.released = true
	fds := h.taken
	h.taken = map[uffdKey]int{}
	h.mu.Unlock()
	close(h.stop)
	if h.following {
		<-h.stopped // it uses pidfd
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	unix.Close(h.pidfd)
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

// LazyOptions say what lazy-pages serves, and from where.
type LazyOptions struct {
	// CRIU is the criu binary.
	CRIU string
	// Images is the image directory lazy-pages reads; Work its work
	// directory, the restore's.
	Images, Work string
	// Pages, when set, has the lazy pages served by a page server process
	// ([Command]) from the files it names, each chunk verified before its
	// first page goes, instead of read by lazy-pages from Images' pages
	// files (which then need hold only the eager pages).
	Pages *Table
	// Wait bounds the wait for lazy-pages to listen.
	Wait time.Duration
}

// StartLazyPages starts `criu lazy-pages` on o.Images, with o.Work as its
// work directory: it listens on Work/lazy-pages.socket (a relative name,
// so no sun_path limit), where CRIU's restore, whose working directory is
// the same work directory, connects. It returns once the daemon says it
// is listening (--status-fd), or an error within o.Wait.
func StartLazyPages(o LazyOptions) (*LazyPages, error) {
	images, work, pages, wait := o.Images, o.Work, o.Pages, o.Wait
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	defer w.Close()
	cmd := exec.Command(o.CRIU, "lazy-pages", "--images-dir", images, "--work-dir", work,
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
		if l.endFetches != nil {
			l.endFetches()
		}
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
	if l.endFetches != nil {
		l.endFetches()
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
		l.clean = true // settled here once the unit is known (SetUnit)
	}
	unit, clean, recorded := l.unit, l.clean, l.recorded
	l.mu.Unlock()
	if clean && unit != 0 {
		settle(unit, recorded, exited)
	}
	close(l.done)
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

// logTail is the end of lazy-pages' log, formatted to follow an error
// message.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 12 {
		lines = lines[len(lines)-12:]
	}
	return fmt.Sprintf("; end of %s:\n%s", path, strings.Join(lines, "\n"))
}
