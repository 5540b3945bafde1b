//go:build linux

package e2e

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// notification is one datagram the daemon sent to $NOTIFY_SOCKET, and
// the pid that sent it (SO_PASSCRED).
type notification struct {
	text string
	pid  int32
	at   time.Time
}

// notifySocket listens on a unixgram socket as systemd's notify socket
// does, with the sender's credentials, and returns its path and what it
// receives.
func notifySocket(t *testing.T) (string, <-chan notification) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	got := make(chan notification, 256)
	go func() {
		b, oob := make([]byte, 4096), make([]byte, 256)
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
			if err != nil {
				return
			}
			m := notification{text: string(b[:n]), pid: -1, at: time.Now()}
			if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(cms) > 0 {
				if cred, err := unix.ParseUnixCredentials(&cms[0]); err == nil {
					m.pid = cred.Pid
				}
			}
			got <- m
		}
	}()
	return path, got
}

// await waits for a notification holding want, from pid, and returns
// those before it.
func await(t *testing.T, got <-chan notification, pid int, want string, within time.Duration) []notification {
	t.Helper()
	var seen []notification
	deadline := time.After(within)
	for {
		select {
		case m := <-got:
			if m.pid != int32(pid) {
				t.Fatalf("notification %q from pid %d, not the daemon's %d: only the main process may speak", m.text, m.pid, pid)
			}
			if strings.Contains(m.text, want+"\n") {
				return seen
			}
			seen = append(seen, m)
		case <-deadline:
			t.Fatalf("no %s within %v; got %v", want, within, seen)
		}
	}
}

// TestNotifyProtocol runs the daemon as systemd would with Type=notify
// and WatchdogSec=: READY=1 once it serves (after the image-park probe),
// WATCHDOG=1 every half the watchdog time, and on SIGTERM with a run
// executing STOPPING=1, then EXTEND_TIMEOUT_USEC while the stop parks it.
// Every notification comes from the daemon's own pid (containerd and the
// shims are not given the socket).
func TestNotifyProtocol(t *testing.T) {
	privileged(t)
	path, got := notifySocket(t)
	d := mustDaemon(t, "notify", func(d *daemon) {
		d.env = []string{"NOTIFY_SOCKET=" + path, "WATCHDOG_USEC=2000000"}
		d.stopDefault = true
	})
	pid := d.cmd.Process.Pid
	await(t, got, pid, "READY=1", 2*time.Minute)
	h, err := d.c.Host(context.Background())
	if err != nil || h.ImageParks.Status == "probing" {
		t.Fatalf("ready, with image parks %+v (%v): READY=1 comes after the probe", h.ImageParks, err)
	}
	await(t, got, pid, "WATCHDOG=1", 5*time.Second)

	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "notified"
	startOracle(t, d, id, oracleImage)
	mustStop(t, d)
	before := await(t, got, pid, "STOPPING=1", time.Second)
	for _, m := range before {
		if strings.Contains(m.text, "EXTEND_TIMEOUT_USEC=") {
			t.Fatalf("EXTEND_TIMEOUT_USEC before STOPPING=1: %q", m.text)
		}
	}
	await(t, got, pid, "EXTEND_TIMEOUT_USEC=30000000", time.Second)
	// The rest of what the stopped daemon sent (its watchdog pings go on
	// through the stop) is in: all of it from its pid.
	for len(got) > 0 {
		if m := <-got; m.pid != int32(pid) {
			t.Fatalf("notification %q from pid %d, not the daemon's %d", m.text, m.pid, pid)
		}
	}

	// The stop parked the run (the default policy, park); the
	// next start resumes it.
	mustStart(t, d)
	await(t, got, d.cmd.Process.Pid, "READY=1", 2*time.Minute)
	r, err := d.run(context.Background(), id)
	if err != nil || r.Status != "running" || r.Segments != 3 {
		t.Fatalf("after the restart: %+v, %v; want it running, parked by the stop and resumed by the start", r, err)
	}
}
