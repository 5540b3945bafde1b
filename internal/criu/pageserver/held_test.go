//go:build linux

package pageserver

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A unit forking and exiting over and over in the lazy window: lazy-pages
// receives each child's userfaultfd and closes it when the child exits.
// The daemon's copy of one lazy-pages closed goes too, or the daemon runs
// out of descriptors. A shell stands for lazy-pages: it holds userfaultfds
// at 3..7 and closes them when told.
func TestHeldDropsClosed(t *testing.T) {
	const n = 5
	cmd := exec.Command("bash", "-c", "while read -r line; do eval \"$line\"; done")
	for range n {
		fd, _, errno := syscall.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
		if errno != 0 {
			t.Fatalf("userfaultfd: %v", errno)
		}
		f := os.NewFile(fd, "uffd")
		defer f.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Process.Kill(); cmd.Wait() }()
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	pid := cmd.Process.Pid
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &held{pidfd: pidfd, taken: map[uffdKey]int{}, stop: make(chan struct{}), stopped: make(chan struct{}), following: true}
	go h.follow(pid, make(chan struct{}))
	defer h.release()
	waitHeld := func(want int) {
		t.Helper()
		for t0 := time.Now(); h.count() != want; time.Sleep(5 * time.Millisecond) {
			if time.Since(t0) > 2*time.Second {
				t.Fatalf("the daemon holds %d copies, want %d", h.count(), want)
			}
		}
	}
	waitHeld(n) // every one held while the shell holds it
	for i := range n {
		if _, err := io.WriteString(in, fmt.Sprintf("exec %d<&-\n", 3+i)); err != nil {
			t.Fatal(err)
		}
		waitHeld(n - i - 1)
	}
}

// While lazy-pages exits its descriptors close one by one: no copy is
// dropped then. This process is not exiting; one reaped is gone.
func TestExiting(t *testing.T) {
	if exiting(os.Getpid()) {
		t.Fatal("this process taken for exiting")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if !exiting(cmd.Process.Pid) {
		t.Fatal("a process reaped not taken for exiting")
	}
}

// A unit that duplicates its restored userfaultfd (or forks children that
// inherit it) does not multiply the daemon's ioctls: UnregisterUnit uses
// each userfaultfd once, in the first process found holding it.
func TestRestoreUffdsOncePerUffd(t *testing.T) {
	fd, _, errno := syscall.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		t.Fatalf("userfaultfd: %v", errno)
	}
	// UFFDIO_API with a lazy restore's features.
	api := [3]uint64{0xAA, restoreFeatures, 0}
	if _, _, errno := syscall.Syscall(unix.SYS_IOCTL, fd, 0xc018aa3f, uintptr(unsafe.Pointer(&api))); errno != 0 {
		unix.Close(int(fd))
		t.Fatalf("UFFDIO_API: %v", errno)
	}
	f := os.NewFile(fd, "uffd")
	cmd := exec.Command("sleep", "60")
	for range 5 {
		cmd.ExtraFiles = append(cmd.ExtraFiles, f) // one userfaultfd at 3..7
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	f.Close()
	used := map[uint64]bool{}
	if fds := restoreUffds(cmd.Process.Pid, used); len(fds) != 1 {
		t.Fatalf("restoreUffds = %v, want one of 3..7", fds)
	}
	if fds := restoreUffds(cmd.Process.Pid, used); len(fds) != 0 {
		t.Fatalf("restoreUffds again = %v, want none: used already", fds)
	}
}
