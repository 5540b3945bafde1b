// Package server is runrecordd's HTTP/JSON API under /v1, served on a
// root-only unix socket.
package server

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
)

// ErrNotSocket is a socket path occupied by something other than a socket.
var ErrNotSocket = errors.New("path exists and is not a socket")

// Listen listens on a unix socket at path with mode 0600. A stale socket
// left by a previous daemon is removed first — but only if it is a socket
// and nothing answers on it; any other file at path is left alone and is
// an error, and so is a live daemon already listening there.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("server: socket directory: %w", err)
	}
	st, err := os.Lstat(path)
	switch {
	case err == nil && st.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("server: %s: %w (%v); remove it or choose another --socket", path, ErrNotSocket, st.Mode().Type())
	case err == nil:
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("server: %s: another daemon is listening there", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("server: removing stale socket: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("server: %s: %w", path, err)
	}
	// Bind under a umask that leaves the socket 0600 from its first
	// instant: a chmod after bind leaves a window in which anyone may
	// connect, and a connection made then waits in the backlog to be
	// served. The umask is the process's; Listen runs before the daemon
	// creates anything else.
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("server: %w", err)
	}
	return l, nil
}
