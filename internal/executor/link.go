//go:build linux

package executor

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A sandbox with network egress and a user namespace gets its link out
// from the createRuntime hook (netHook): runc makes its network namespace
// at the create, and CRIU a new, empty one at every restore, and only the
// hook runs between the namespace's making and the unit's first
// instruction (or its first restored socket). The hook cannot link the
// namespace itself (the link is the daemon's: its slot, rules and
// addresses, over netlink), so it asks the executor through two FIFOs in
// StateDir/link/<id>: it writes the namespace's pid to "pid" and waits
// for a line on "ack", "ok" once the link is made. The executor holds
// both FIFOs open for reading and writing while it creates or restores
// the sandbox, so the hook never waits on an open; its end comes with
// runc's hook timeout (linkTimeout) if the executor goes away.

// linkTimeout is the seconds runc gives the createRuntime hook.
const linkTimeout = 30

// linkDir is where sandbox id's hook asks for its link.
func (c *Client) linkDir(id string) string {
	return filepath.Join(c.cfg.StateDir, "link", id)
}

// linkServer answers one hook's request for a link.
type linkServer struct {
	dir      string
	pid, ack *os.File
	done     chan error // the request's outcome; errNoRequest if none came
	once     sync.Once
	err      error
	took     time.Duration // the link's making, once served
}

var errNoRequest = errors.New("the sandbox's hook asked for no link")

// serveLink makes sandbox id's FIFOs and answers its hook's request with
// link, on a goroutine, until close.
func (c *Client) serveLink(id string, link func(netns string) error) (_ *linkServer, retErr error) {
	dir := c.linkDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	var fs [2]*os.File
	for i, n := range []string{"pid", "ack"} {
		p := filepath.Join(dir, n)
		if err := unix.Mkfifo(p, 0o600); err != nil {
			return nil, fmt.Errorf("link FIFO: %w", err)
		}
		// Read and write: never blocks, never reads an end of file.
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			if fs[0] != nil {
				fs[0].Close()
			}
			return nil, fmt.Errorf("link FIFO: %w", err)
		}
		fs[i] = f
	}
	s := &linkServer{dir: dir, pid: fs[0], ack: fs[1], done: make(chan error, 1)}
	go s.serve(link)
	return s, nil
}

func (s *linkServer) serve(link func(string) error) {
	line, err := bufio.NewReader(s.pid).ReadString('\n')
	if err != nil {
		s.done <- errNoRequest // closed
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 1 {
		err = fmt.Errorf("%w: the hook sent pid %q", ErrInvalid, strings.TrimSpace(line))
	} else {
		t0 := time.Now()
		err = link("/proc/" + strconv.Itoa(pid) + "/ns/net")
		s.took = time.Since(t0)
	}
	reply := "ok\n"
	if err != nil {
		reply = "no\n"
	}
	if _, werr := s.ack.WriteString(reply); werr != nil && err == nil {
		err = fmt.Errorf("answer the hook: %w", werr)
	}
	s.done <- err
}

// close stops serving and says how the request went: an error if the
// link failed or no request came. A nil server is closed.
func (s *linkServer) close() error {
	if s == nil {
		return nil
	}
	s.once.Do(func() {
		// The answer is in the FIFO's buffer: the hook reads it after
		// the executor's end is closed.
		s.pid.Close()
		s.err = <-s.done
		s.ack.Close()
		if err := os.RemoveAll(s.dir); err != nil && s.err == nil {
			s.err = err
		}
		if s.err != nil {
			s.err = fmt.Errorf("network: link out: %w", s.err)
		}
	})
	return s.err
}
