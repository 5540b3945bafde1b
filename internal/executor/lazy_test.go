//go:build linux

package executor_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/executor"
	"golang.org/x/sys/unix"
)

// TestRestoreLazy restores the oracle lazily (the prototype of
// docs/lazy-resume.md): the unit runs before its buffer is resident, both
// of its processes' userfaultfds can be held, every page arrives (the
// lazy-pages daemon exits cleanly), the restored process goes on as the
// same run with its buffer intact, and a later checkpoint of the sandbox is
// an ordinary one that holds the whole buffer.
func TestRestoreLazy(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "lazy"
	s := mustStart(t, id, spec, out)
	before := last(waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt >= 10 }))
	cp, atDump := checkpointAway(t, s, out)

	s, lp, rst, err := client.RestoreLazy(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	// Far fewer than the buffer's 16,384 pages were restored eagerly.
	if rst.PagesRestored >= 64<<20/4096 {
		t.Errorf("the lazy restore restored %d pages eagerly", rst.PagesRestored)
	}
	n, release, err := lp.HoldUffds()
	if err != nil {
		t.Fatal(err)
	}
	// One per task, the oracle and its child: lazy-pages keeps a task
	// whose pages are all in until every task's are
	// (deploy/criu/2-lazy-pages-keep-uffds.patch); or none, when it had
	// brought every page in and exited before the restore returned.
	// Without the patch, a task's may be gone already: at most 2.
	exited := false
	select {
	case <-lp.Done():
		exited = true
	default:
	}
	if n == 0 && !exited {
		// Every page in, lazy-pages closes its copies before it exits:
		// none held may be one exiting, not yet reaped.
		select {
		case <-lp.Done():
			exited = true
		case <-time.After(10 * time.Second):
		}
	}
	if why := criuBuild(t).Lacks(criu.KeepsUffds); why != "" {
		t.Logf("not checked that every userfaultfd is held: %s", why)
		if n > 2 {
			t.Errorf("held %d userfaultfds, want at most 2", n)
		}
	} else if n != 2 && (n != 0 || !exited) {
		t.Errorf("held %d userfaultfds (lazy-pages exited: %v), want 2, or 0 after its exit", n, exited)
	}
	<-lp.Done()
	release()
	if criuBuild(t).Has(criu.TasksKeepUffds) {
		// Each restored task keeps its own userfaultfd (patch 8); with
		// every page in, none of its ranges is registered any more, so a
		// fault on a page the dump did not write does not wait for ever.
		unit := int(s.Pid())
		smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", unit))
		if err != nil {
			t.Fatal(err)
		}
		if uffds(unit) != 1 || bytes.Contains(smaps, []byte(" um")) {
			t.Errorf("every page in: the unit holds %d userfaultfds, ranges still registered: %v", uffds(unit), bytes.Contains(smaps, []byte(" um")))
		}
	}
	if client.LazyRestoring(id) || client.LazyUnfinished(id) {
		t.Error("LazyRestoring or LazyUnfinished after lazy-pages exited, every page in")
	}
	resident, err := lp.Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore %v (task %v, %d pages eager); every page resident %v after lazy-pages started", rst.Total, rst.Task, rst.PagesRestored, resident)

	ls := waitLines(t, out.Stdout, "a line verified after the restore", func(ls []line) bool { return last(ls).VerifiedAt > atDump.Counter })
	for i, l := range ls {
		if l.Counter != uint64(i+1) || l.Checksum != before.Checksum || l.Verify != before.Checksum || !l.FileOK ||
			l.StartTime != before.StartTime || l.Pid != before.Pid || l.ChildPid != before.ChildPid {
			t.Fatalf("line %d %+v; first %+v", i, l, before)
		}
	}

	// The sandbox's next dump writes every page of the buffer, even with
	// the lazy-pages line a daemon that crashed between the restore and
	// the configuration's repair would have left (the dump repairs it).
	// (A dump with lazy-pages would wait for a page server: the deadline
	// bounds it.)
	if err := client.LeaveLazyConfigForTest(id); err != nil {
		t.Fatal(err)
	}
	cp2 := executor.Checkpoint{ImageDir: filepath.Join(filepath.Dir(cp.ImageDir), "images2"), Keep: true, Deadline: 20 * time.Second}
	st, err := s.Checkpoint(ctx, cp2)
	if err != nil {
		t.Fatal(err)
	}
	if st.PagesWritten < 64<<20/4096 {
		t.Fatalf("a checkpoint after the lazy restore wrote %d pages, want the 64 MiB buffer", st.PagesWritten)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLazyHoldersGone takes every holder of a lazily restored unit's
// userfaultfds away in the lazy window but the unit's own: lazy-pages is
// stopped once it holds both tasks' (before the unit runs, so no page
// arrives), no copy is taken (a daemon killed at that moment holds
// none), and lazy-pages is then killed. The kernel fills a registered
// range's missing pages with zeros once the last reference to its
// userfaultfd closes; the restored tasks keep their own
// (deploy/criu/8-restored-tasks-keep-uffds.patch), so the oracle's
// faults wait instead: it computes no line on a zero page, and a read
// of its memory through /proc finds no missing page zero-filled.
func TestLazyHoldersGone(t *testing.T) {
	privileged(t)
	needsPatch(t, criu.TasksKeepUffds)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	spec.Env = []string{"VERIFY_EVERY=2"}
	const id = "lazy-holders"
	s := mustStart(t, id, spec, out)
	before := last(waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt >= 2 }))
	cp, atDump := checkpointAway(t, s, out)

	found := make(chan int, 1)
	go stopLazyPages(id, 2, found)
	s, lp, _, err := client.RestoreLazy(ctx, id, spec, cp, out)
	pid := <-found
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	if pid == 0 {
		lp.Kill()
		t.Fatal("no lazy-pages holding two userfaultfds")
	}
	lp.Kill()
	if _, err := lp.Result(); err == nil {
		t.Fatal("lazy-pages killed mid-way exited cleanly")
	}
	unit := int(s.Pid())
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", unit))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	start, end := largestAnon(t, unit)
	// The unit has had two verifications' time to run on its memory.
	time.Sleep(2 * time.Second)
	for _, l := range output(t, out.Stdout) {
		if l.Checksum != before.Checksum || l.Verify != before.Checksum {
			t.Fatalf("a line computed on memory that is not the oracle's: %+v; before the park %+v", l, before)
		}
	}
	if err := syscall.Kill(unit, 0); err != nil {
		t.Fatalf("the unit is gone (%v): stderr %s", err, readErr(out))
	}
	// The mapping's pages that had not arrived are still missing (EIO):
	// the kernel fills a range's missing pages with zeros all at once,
	// when the last reference to its userfaultfd closes, so a filled
	// range has no missing page left. A page that came before the stop
	// may be zeros of its own (the mapping holds more than the buffer:
	// under load lazy-pages can serve a few before it is stopped).
	page := make([]byte, 4096)
	zero, missing := 0, 0
	for a := start; a < end; a += 1 << 20 {
		if _, err := mem.ReadAt(page, int64(a)); err != nil {
			missing++
			continue
		}
		if bytes.Count(page, []byte{0}) == len(page) {
			zero++
		}
	}
	t.Logf("mapping %#x-%#x: %d pages missing, %d zero (after line %d)", start, end, missing, zero, atDump.Counter)
	if missing == 0 {
		t.Fatalf("%d of the sampled pages read as zeros, %d missing: the kernel filled the unit's missing pages", zero, missing)
	}
}

// stopLazyPages stops (SIGSTOP) this process's lazy-pages child of
// sandbox id's restore once it holds want userfaultfds, and sends its
// pid on found (0 when there was none within a minute).
func stopLazyPages(id string, want int, found chan<- int) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			n, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n))
			if err != nil || !bytes.Contains(cmd, []byte("lazy-pages\x00")) || !bytes.Contains(cmd, []byte("/criu/"+id+"/restore")) ||
				ppid(n) != os.Getpid() {
				continue
			}
			if uffds(n) >= want {
				_ = syscall.Kill(n, syscall.SIGSTOP)
				found <- n
				return
			}
		}
	}
	found <- 0
}

// ppid is process pid's parent, 0 when it is not known.
func ppid(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// uffds is how many userfaultfds process pid holds.
func uffds(pid int) int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink(filepath.Join(dir, e.Name())); l == "anon_inode:[userfaultfd]" {
			n++
		}
	}
	return n
}

// largestAnon is process pid's largest private anonymous writable
// mapping (the oracle's buffer is in it).
func largestAnon(t *testing.T, pid int) (start, end uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 5 || !strings.HasPrefix(f[1], "rw-p") {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		a, _ := strconv.ParseUint(lo, 16, 64)
		z, _ := strconv.ParseUint(hi, 16, 64)
		if z-a > end-start {
			start, end = a, z
		}
	}
	if end-start < 32<<20 {
		t.Fatalf("no anonymous mapping of the oracle's 64 MiB buffer in %s", b)
	}
	return start, end
}

// readErr is the unit's stderr.
func readErr(out executor.Output) []byte {
	b, _ := os.ReadFile(out.Stderr)
	return b
}

// forkedLazily is a lazily restored oracle (a buffer of sizeMB) that
// forked right after the restore, the daemon's copies held (HoldUffds).
type forkedLazily struct {
	lp          *pageserver.LazyPages
	unit, child int
	buf         uint64        // the buffer's address, in both
	held        time.Duration // from the signal to the fork's userfaultfd held, 0 if never
	seen        time.Duration // from the signal to the forked process seen
	forked      time.Time     // the signal
}

// forkLazily parks the oracle with FORK_ON_USR2=1, restores it lazily,
// takes the copies and has it fork (SIGUSR2).
func forkLazily(t *testing.T, id string, sizeMB int) forkedLazily {
	t.Helper()
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	spec.Env = []string{"FORK_ON_USR2=1", fmt.Sprintf("SIZE_MB=%d", sizeMB)}
	spec.MemoryBytes = uint64(3*sizeMB) << 20
	s := mustStart(t, id, spec, out)
	first := last(waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt > 0 }))
	cp, _ := checkpointAway(t, s, out)
	// Read from the disk, not the page cache, the pages come in slower
	// than the fork and the daemon's copy of its userfaultfd (on a quick
	// machine, a cached 256 MiB came in first).
	uncachePages(t, cp.ImageDir)

	s, lp, _, err := client.RestoreLazy(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	n, release, err := lp.HoldUffds()
	if err != nil {
		destroy(t, s)
		t.Fatal(err)
	}
	// The unit dies before the copies go, as the daemon does it.
	t.Cleanup(func() { destroy(t, s); release() })
	f := forkedLazily{lp: lp, unit: int(s.Pid()), buf: first.BufAddr}
	restored := children(f.unit)
	f.forked = time.Now()
	if err := syscall.Kill(f.unit, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); f.child == 0; time.Sleep(50 * time.Microsecond) {
		if f.held == 0 && lp.Held() > n {
			f.held = time.Since(f.forked)
		}
		for _, c := range children(f.unit) {
			if !slices.Contains(restored, c) {
				f.child, f.seen = c, time.Since(f.forked)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process forked by the oracle (children %v)", children(f.unit))
		}
	}
	for deadline := time.Now().Add(time.Second); f.held == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Microsecond) {
		if lp.Held() > n {
			f.held = time.Since(f.forked)
		}
	}
	select {
	case <-lp.Done():
		t.Fatal("every page was in before the fork: no lazy window to fork in")
	default:
	}
	if f.held == 0 {
		t.Fatalf("the daemon holds %d userfaultfds a second after the fork, %d before", lp.Held(), n)
	}
	return f
}

// TestLazyFork forks the oracle (a copy of its memory that runs nothing)
// inside the lazy window: the kernel hands the copy's userfaultfd to
// lazy-pages alone, which serves it the pages its parent had not got at
// the fork, and the daemon takes a copy of it too (within about
// forkPoll). Once every page is in, the copy's buffer is the oracle's
// pattern, byte for byte. The test logs the fork window docs/lazy-resume.md
// ("Holders") names: until the daemon holds the fork's userfaultfd, and
// until every page is resident.
func TestLazyFork(t *testing.T) {
	privileged(t)
	f := forkLazily(t, "lazy-fork", 128)
	<-f.lp.Done()
	if _, err := f.lp.Result(); err != nil {
		t.Fatal(err)
	}
	t.Logf("fork window: the forked process seen %v after the signal, its userfaultfd held by the daemon %v after; every page resident %v after the signal",
		f.seen, f.held-f.seen, f.lp.ExitedAt().Sub(f.forked))
	want := pattern(128 << 20)
	got := readMem(t, f.child, f.buf, make([]byte, len(want)))
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("the forked copy's buffer differs from the oracle's pattern at byte %d (page %d): %x", i, i/4096, got[i&^4095:i&^4095+32])
	}
}

// TestLazyForkLazyPagesKilled kills lazy-pages once the daemon holds the
// userfaultfd of a process the oracle forked in the lazy window: the
// copy's pages that had not come stay missing (a read through /proc
// fails) rather than zero-filled; every page that reads is the oracle's.
func TestLazyForkLazyPagesKilled(t *testing.T) {
	privileged(t)
	f := forkLazily(t, "lazy-fork-killed", 256)
	f.lp.Kill()
	want := pattern(256 << 20)
	page := make([]byte, 4096)
	missing := 0
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", f.child))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	for p := 0; p < len(want); p += 4096 {
		if _, err := mem.ReadAt(page, int64(f.buf)+int64(p)); err != nil {
			missing++
			continue
		}
		if !bytes.Equal(page, want[p:p+4096]) {
			t.Fatalf("page %d of the forked copy's buffer, lazy-pages killed: %x…, not the oracle's", p/4096, page[:32])
		}
	}
	t.Logf("lazy-pages killed %v after the fork: %d of %d pages of the copy's buffer missing, none zero-filled", time.Since(f.forked), missing, len(want)/4096)
	if missing == 0 {
		t.Fatal("every page of the copy had come before lazy-pages was killed: nothing tested")
	}
}

// pattern is the oracle's buffer of size bytes (units/oracle, fill).
func pattern(size int) []byte {
	buf := make([]byte, size)
	x := uint64(0x9E3779B97F4A7C15)
	for i := 0; i+8 <= len(buf); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(buf[i:], x)
	}
	return buf
}

// firstDiff is the first index where a and b differ, -1 if none.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// children is process pid's children (of every thread).
func children(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// readMem reads process pid's memory at addr into buf.
func readMem(t *testing.T, pid int, addr uint64, buf []byte) []byte {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.ReadAt(buf, int64(addr))
	if err != nil && n == 0 {
		t.Fatalf("reading process %d at %#x: %v", pid, addr, err)
	}
	return buf[:n]
}

// TestLazyParkUffdRefs parks a lazily restored oracle that refers to the
// userfaultfd the restore left it
// (deploy/criu/8-restored-tasks-keep-uffds.patch) from an epoll of its own,
// or from a second descriptor. A dump leaves that userfaultfd out, so a
// park that recorded the epoll could not be resumed (epoll_ctl: EBADF),
// and one that dropped the dup would not be the unit's state: the park is
// refused, with CRIU's reason, and the unit goes on running on its own
// memory. Once the oracle closes the reference, the park succeeds and the
// unit resumes from it.
func TestLazyParkUffdRefs(t *testing.T) {
	privileged(t)
	needsPatch(t, criu.TasksKeepUffds)
	for _, c := range []struct{ kind, reason string }{
		{"epoll", "lists fd"},
		{"dup", "holds a lazy restore's userfaultfd at fds"},
	} {
		t.Run(c.kind, func(t *testing.T) { parkUffdRef(t, c.kind, c.reason) })
	}
}

// parkUffdRef is TestLazyParkUffdRefs with UFFD_REF_ON_USR2=kind: the
// refused park's error says reason.
func parkUffdRef(t *testing.T, kind, reason string) {
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	spec.Env = []string{"UFFD_REF_ON_USR2=" + kind, "VERIFY_EVERY=2"}
	id := "lazy-uffd-" + kind
	s := mustStart(t, id, spec, out)
	before := last(waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt >= 2 }))
	cp, _ := checkpointAway(t, s, out)
	// Read from the disk, not the page cache, the pages come in slower
	// than the fork and the daemon's copy of its userfaultfd (on a quick
	// machine, a cached 256 MiB came in first).
	uncachePages(t, cp.ImageDir)

	s, lp, _, err := client.RestoreLazy(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	_, release, err := lp.HoldUffds()
	if err != nil {
		t.Fatal(err)
	}
	<-lp.Done()
	release()
	if _, err := lp.Result(); err != nil {
		t.Fatal(err)
	}
	toggle := func(n uint64) line {
		t.Helper()
		if err := syscall.Kill(int(s.Pid()), syscall.SIGUSR2); err != nil {
			t.Fatal(err)
		}
		return last(waitLines(t, out.Stdout, fmt.Sprintf("toggle %d of the %s", n, kind), func(ls []line) bool { return last(ls).UffdToggles == n }))
	}
	if l := toggle(1); l.UffdRefs != 1 {
		t.Fatalf("the oracle's %s refers to %d userfaultfds, want the one the restore left it", kind, l.UffdRefs)
	}
	same := func(l line) bool {
		return l.Checksum == before.Checksum && l.Verify == before.Checksum && l.Pid == before.Pid && l.StartTime == before.StartTime
	}

	dir := t.TempDir()
	refused := executor.Checkpoint{ImageDir: filepath.Join(dir, "refused"), Rootfs: filepath.Join(dir, "refused.tar"), Keep: true, Deadline: 20 * time.Second}
	_, err = s.Checkpoint(ctx, refused)
	if !errors.Is(err, executor.ErrCheckpoint) || !strings.Contains(err.Error(), reason) {
		t.Fatalf("park of a unit whose %s refers to its kept userfaultfd: %v; want %v saying %q", kind, err, executor.ErrCheckpoint, reason)
	}
	t.Logf("refused: %v", err)
	// The unit goes on, on its own memory.
	at := last(output(t, out.Stdout)).Counter
	for _, l := range waitLines(t, out.Stdout, "a line verified after the refused park", func(ls []line) bool { return last(ls).VerifiedAt > at }) {
		if !same(l) {
			t.Fatalf("line %+v; before the first park %+v", l, before)
		}
	}

	if l := toggle(2); l.UffdRefs != 0 {
		t.Fatalf("the oracle's %s closed, %d userfaultfds referred to", kind, l.UffdRefs)
	}
	cp2, atDump := checkpointAway(t, s, out)
	s, _, err = client.Restore(ctx, id, spec, cp2, out)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range waitLines(t, out.Stdout, "a line verified after the resume", func(ls []line) bool { return last(ls).VerifiedAt > atDump.Counter }) {
		if !same(l) {
			t.Fatalf("line %+v after the resume; before the first park %+v", l, before)
		}
	}
}

// TestLazyRestoreLazyPagesKilled kills lazy-pages while the lazy restore
// is under way (once it holds a task's userfaultfd): the restore fails
// with ErrRestore soon after, not at its deadline (the unit's tasks would
// wait on their pages until then), and leaves no record of lazy-pages'
// pids behind: the sandbox is not taken for one restored lazily whose
// pages are still to come (LazyUnfinished), and an eager restore of the
// same checkpoint runs and is not either.
func TestLazyRestoreLazyPagesKilled(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "lazy-restore-killed"
	s := mustStart(t, id, spec, out)
	waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt > 0 })
	cp, atDump := checkpointAway(t, s, out)
	cp.Deadline = 40 * time.Second

	type kill struct {
		pid int
		at  time.Time
	}
	killed := make(chan kill, 1)
	go func() {
		found := make(chan int, 1)
		stopLazyPages(id, 1, found)
		pid := <-found
		if pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		killed <- kill{pid, time.Now()}
	}()
	s, lp, _, err := client.RestoreLazy(ctx, id, spec, cp, out)
	failed := time.Now()
	k := <-killed
	pid := k.pid
	if err == nil {
		lp.Kill()
		destroy(t, s)
		t.Fatalf("the lazy restore whose lazy-pages (%d) was stopped, then killed, succeeded", pid)
	}
	t.Logf("restore: %v", err)
	if pid == 0 {
		t.Fatal("no lazy-pages holding a userfaultfd")
	}
	if !errors.Is(err, executor.ErrRestore) {
		t.Errorf("restore: %v, want %v", err, executor.ErrRestore)
	}
	// Its deadline is 40 s.
	if took := failed.Sub(k.at); took > 10*time.Second {
		t.Errorf("the restore failed %v after lazy-pages was killed", took)
	} else {
		t.Logf("the restore failed %v after lazy-pages was killed", took)
	}
	if client.LazyUnfinished(id) || client.LazyRestoring(id) {
		t.Error("a failed lazy restore left its pids recorded")
	}
	if t.Failed() {
		t.FailNow()
	}
	s, _, err = client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	if client.LazyUnfinished(id) {
		t.Fatal("an eager restore taken for an unfinished lazy one")
	}
	waitLines(t, out.Stdout, "a line verified after the restore", func(ls []line) bool { return last(ls).VerifiedAt > atDump.Counter })
}

// uncachePages writes the pages images in dir back and drops them from
// the page cache.
func uncachePages(t *testing.T, dir string) {
	t.Helper()
	ps, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	if err != nil || len(ps) == 0 {
		t.Fatalf("no pages images in %s: %v", dir, err)
	}
	for _, p := range ps {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		err = errors.Join(f.Sync(), unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED), f.Close())
		if err != nil {
			t.Fatal(err)
		}
	}
}
