//go:build linux

package pageserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrChunkRefused is a served lazy restore whose page server found a
// stored chunk that does not hash to its listed address: it served none
// of that chunk's pages and hung up, and the restore's pages are lost
// (the error wraps [ErrPagesLost] too).
var ErrChunkRefused = errors.New("pageserver: the page server refused a chunk that is not the one listed")

// sendBuffer is the page server's socket send buffer.
const sendBuffer = 8 << 20

// serverLog is the page server's log, in the restore's work directory.
const serverLog = "page-server.log"

// startServer starts the page server of pages ([Command]) on one end of a
// socket pair and returns the other, for lazy-pages.
func (l *LazyPages) startServer(pages *Table, work string) (*os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("page server socket: %w", err)
	}
	// A reply (at most 4 MiB) goes into the socket whole: lazy-pages
	// reads it in a few calls instead of one per default buffer's worth.
	_ = unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer)
	mine, theirs := os.NewFile(uintptr(fds[0]), "page-server"), os.NewFile(uintptr(fds[1]), "lazy-pages")
	defer mine.Close()
	l.serverLog = filepath.Join(work, serverLog)
	logf, err := os.OpenFile(l.serverLog, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		theirs.Close()
		return nil, err
	}
	defer logf.Close()
	heldR, heldW, err := os.Pipe()
	if err != nil {
		theirs.Close()
		return nil, err
	}
	defer heldR.Close()
	var fetch *os.File
	if pages.owes() {
		ours, server, err := fetchPair()
		if err != nil {
			theirs.Close()
			heldW.Close()
			return nil, err
		}
		// Closed here once the server has its copy: its end, or its
		// start's failure, ends serveFetches.
		defer server.Close()
		fetch = server
		ctx, cancel := context.WithCancel(context.Background())
		l.endFetches = cancel
		go func() {
			serveFetches(ctx, pages, ours)
			ours.Close()
		}()
	}
	cmd := Command(mine, heldR, fetch)
	// Names the restore it serves, for Pids.KillLeftovers.
	cmd.Env = append(cmd.Env, serverOf+"="+work)
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		theirs.Close()
		heldW.Close()
		return nil, fmt.Errorf("page server: %w", err)
	}
	l.server, l.held = cmd, heldW
	// The extent table goes in while lazy-pages starts; a server that has
	// not read it all yet only delays its first reply.
	go func() {
		_ = pages.Encode(in)
		in.Close()
	}()
	return theirs, nil
}

// fetchPair is the socket pair the page server asks the daemon for owed
// extents on: the daemon's end, then the server's.
func fetchPair() (ours, theirs *os.File, err error) {
	// Non-blocking: the daemon's end is polled, and closing it ends a
	// read of it (the server's end is made blocking as it is passed on).
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("page server fetch socket: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "fetches"), os.NewFile(uintptr(fds[1]), "fetch"), nil
}

// sayHeld tells the page server the unit's userfaultfds are held
// (Server.Hold); letGo, once, that they are not (any more):
// the pipe's end. The daemon's own end, should it stop, says the same.
func (l *LazyPages) sayHeld() {
	if l.held != nil {
		_, _ = l.held.Write([]byte{HeldByte})
	}
}

func (l *LazyPages) letGo() {
	l.heldOnce.Do(func() {
		if l.held != nil {
			l.held.Close()
		}
	})
}

// serverWait bounds the page server's end after lazy-pages' exit.
const serverWait = 5 * time.Second

// waitServer waits for the page server to end, and returns why it ended
// if that was not lazy-pages saying it was done.
func (l *LazyPages) waitServer() error {
	done := make(chan error, 1)
	go func() { done <- l.server.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(serverWait):
		_ = l.server.Process.Kill()
		err = fmt.Errorf("page server still running %s after lazy-pages ended: killed (%w)", serverWait, <-done)
	}
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == ExitRefused {
		err = ErrChunkRefused
	}
	return fmt.Errorf("page server: %w: %s", err, serverSaid(l.serverLog))
}

// serverSaid is the first line of the page server's log: why it stopped
// serving, when it did not finish.
func serverSaid(log string) string {
	f, err := os.Open(log)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	b := make([]byte, 1024)
	n, _ := io.ReadFull(f, b)
	s, _, _ := strings.Cut(string(b[:n]), "\n")
	return s
}

// CPU is, once Done is closed, the processor time (user and system)
// lazy-pages and the page server (zero without one) used.
func (l *LazyPages) CPU() (lazyPages, server time.Duration) {
	<-l.done
	if ps := l.cmd.ProcessState; ps != nil {
		lazyPages = ps.UserTime() + ps.SystemTime()
	}
	if l.server != nil && l.server.ProcessState != nil {
		server = l.server.ProcessState.UserTime() + l.server.ProcessState.SystemTime()
	}
	return lazyPages, server
}
