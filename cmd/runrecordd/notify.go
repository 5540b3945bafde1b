// The daemon speaks systemd's service notification protocol to the
// service manager that started this process: one datagram of
// newline-separated VAR=VALUE assignments, sent to the unix datagram
// socket named by $NOTIFY_SOCKET (a path, or "@name" for the abstract
// namespace). The daemon says READY=1 once it serves, STOPPING=1 when it
// begins to stop, EXTEND_TIMEOUT_USEC while a long stop goes on, and
// WATCHDOG=1 every half $WATCHDOG_USEC (docs/daemon.md, "Stop and
// start").
//
// Without $NOTIFY_SOCKET every send does nothing: the daemon runs the same
// under systemd, under another supervisor, or from a shell.

package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// notifier sends notifications to one service manager. The zero value,
// and a nil one, send nothing.
type notifier struct {
	socket   string        // $NOTIFY_SOCKET
	watchdog time.Duration // $WATCHDOG_USEC, when it is this process's
}

// notifierFromEnv reads the service manager's variables and removes them from
// this process's environment, so that the processes it starts (containerd,
// shims, units) neither inherit nor answer them: systemd hears this
// process alone.
func notifierFromEnv() *notifier {
	n := &notifier{socket: os.Getenv("NOTIFY_SOCKET")}
	if usec, err := strconv.ParseUint(os.Getenv("WATCHDOG_USEC"), 10, 63); err == nil && usec > 0 {
		pid := os.Getenv("WATCHDOG_PID")
		if pid == "" || pid == strconv.Itoa(os.Getpid()) {
			n.watchdog = time.Duration(usec) * time.Microsecond
		}
	}
	for _, v := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} {
		_ = os.Unsetenv(v)
	}
	return n
}

// Watchdog is the service's watchdog time ($WATCHDOG_USEC), zero when it
// has none: WATCHDOG=1 must be sent more often than that.
func (n *notifier) Watchdog() time.Duration {
	if n == nil {
		return 0
	}
	return n.watchdog
}

// Send sends the assignments, one datagram. Without a socket it does
// nothing.
func (n *notifier) Send(assignments ...string) error {
	if n == nil || n.socket == "" {
		return nil
	}
	if !strings.HasPrefix(n.socket, "/") && !strings.HasPrefix(n.socket, "@") {
		return fmt.Errorf("notify: NOTIFY_SOCKET %q: want an absolute path or @name", n.socket)
	}
	// Go's net package maps a leading "@" to the abstract namespace.
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: n.socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(strings.Join(assignments, "\n") + "\n")); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

// Ready says the service is up.
func (n *notifier) Ready() error { return n.Send("READY=1", "STATUS=serving") }

// Stopping says the service has begun to stop.
func (n *notifier) Stopping() error { return n.Send("STOPPING=1", "STATUS=stopping") }

// ExtendTimeout asks for d more from now before the start or stop under
// way times out.
func (n *notifier) ExtendTimeout(d time.Duration) error {
	return n.Send("EXTEND_TIMEOUT_USEC=" + strconv.FormatInt(d.Microseconds(), 10))
}

// Extending sends ExtendTimeout(3*every) now and every period until the
// returned function is called: a start or stop that takes long keeps
// systemd from killing it, and one that hangs still times out.
func (n *notifier) Extending(every time.Duration) (stop func()) {
	if n == nil || n.socket == "" {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	_ = n.ExtendTimeout(3 * every)
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = n.ExtendTimeout(3 * every)
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// KeepAlive sends WATCHDOG=1 every half watchdog time while healthy says
// the service works, until the returned function is called: a service
// that stops answering misses its pings, and systemd restarts it.
// Without a watchdog it does nothing.
func (n *notifier) KeepAlive(healthy func() bool) (stop func()) {
	if n.Watchdog() == 0 || n.socket == "" {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(n.watchdog / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if healthy() {
					_ = n.Send("WATCHDOG=1")
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
