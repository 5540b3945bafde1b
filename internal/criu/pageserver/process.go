package pageserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// envServe, set in a process's environment, makes the binary a page
// server ([MaybeRun]).
const envServe = "RUNRECORDD_PAGE_SERVER"

// Exit statuses of the page server process.
const (
	// ExitRefused: a chunk did not hash to its listed address
	// ([ErrRefused]).
	ExitRefused = 3
	// ExitFailed: any other failure (a request refused, a extent table that
	// did not decode, a file that could not be read).
	ExitFailed = 1
)

// Command is a page server process: this same binary again
// (/proc/self/exe, which names it even after its file was replaced),
// which [MaybeRun] turns into the server. It reads its extent table on stdin,
// serves lazy-pages on conn (its fd 3), hanging up on a failure only
// while held (its fd 4; [Server.Hold]) says the unit's userfaultfds are
// held, and writes what went wrong, and a last line of what it served, to
// stderr. Write [HeldByte] to held's other end once the userfaultfds are
// held, and close it when they are let go. fetch, for a table with owed
// extents, is where it asks the daemon for them (its fd 5; fetch.go). It runs in its own session: a
// daemon that stops does not take it along, the unit needs its pages.
func Command(conn, held, fetch *os.File) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), envServe+"=1")
	cmd.ExtraFiles = []*os.File{conn, held}
	if fetch != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, fetch)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// MaybeRun is the page server process [Command] starts: when this process
// was started as one, it serves and exits; otherwise it returns at once.
// Call it first in the main (and TestMain) of every binary that restores
// lazily with served pages.
func MaybeRun() {
	if os.Getenv(envServe) == "" {
		return
	}
	os.Exit(run())
}

func run() int {
	m, err := Decode(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return ExitFailed
	}
	conn := os.NewFile(3, "lazy-pages")
	s := New(m)
	s.Hold(os.NewFile(4, "held"))
	if m.owes() {
		s.FetchFrom(os.NewFile(5, "fetch"))
	}
	err = s.Serve(conn)
	st := s.Stats()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	fmt.Fprintf(os.Stderr, "served %d requests, %d pages; %d chunks verified; waited %s for chunks, %s writing\n", st.Requests, st.Pages, st.Verified,
		st.Waited.Round(time.Millisecond), st.Written.Round(time.Millisecond))
	switch {
	case errors.Is(err, ErrRefused):
		return ExitRefused
	case err != nil:
		return ExitFailed
	}
	return 0
}
