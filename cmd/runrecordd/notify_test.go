package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listenNotify makes a unixgram socket at name (a path, or @name) and returns
// what it receives, one datagram a string.
func listenNotify(t *testing.T, name string) <-chan string {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	got := make(chan string, 64)
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := c.Read(b)
			if err != nil {
				return
			}
			got <- string(b[:n])
		}
	}()
	return got
}

func nextNotice(t *testing.T, got <-chan string) string {
	t.Helper()
	select {
	case s := <-got:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no notification")
		return ""
	}
}

func TestNotifierFromEnvSendsAndHidesTheSocket(t *testing.T) {
	for _, name := range []string{filepath.Join(t.TempDir(), "notify"), "@runrecordd-notify-test-" + strconv.Itoa(os.Getpid())} {
		t.Run(name[:1], func(t *testing.T) {
			got := listenNotify(t, name)
			t.Setenv("NOTIFY_SOCKET", name)
			t.Setenv("INVOCATION_ID", "")
			t.Setenv("WATCHDOG_USEC", "200000")
			t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
			n := notifierFromEnv()
			for _, v := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} {
				if _, ok := os.LookupEnv(v); ok {
					t.Errorf("%s is still in the environment: a child would inherit it", v)
				}
			}
			if n.Watchdog() != 200*time.Millisecond {
				t.Fatalf("watchdog %v", n.Watchdog())
			}
			if err := n.Ready(); err != nil {
				t.Fatal(err)
			}
			if s := nextNotice(t, got); s != "READY=1\nSTATUS=serving\n" {
				t.Fatalf("ready sent %q", s)
			}
			if err := n.ExtendTimeout(90 * time.Second); err != nil {
				t.Fatal(err)
			}
			if s := nextNotice(t, got); s != "EXTEND_TIMEOUT_USEC=90000000\n" {
				t.Fatalf("extend sent %q", s)
			}
		})
	}
}

func TestWatchdogPingsWhileHealthy(t *testing.T) {
	name := filepath.Join(t.TempDir(), "notify")
	got := listenNotify(t, name)
	n := &notifier{socket: name, watchdog: 40 * time.Millisecond}
	healthy := make(chan bool, 1)
	healthy <- true
	ok := true
	stop := n.KeepAlive(func() bool {
		select {
		case ok = <-healthy:
		default:
		}
		return ok
	})
	if s := nextNotice(t, got); s != "WATCHDOG=1\n" {
		t.Fatalf("sent %q", s)
	}
	healthy <- false
	time.Sleep(60 * time.Millisecond)
	for len(got) > 0 {
		<-got
	}
	time.Sleep(100 * time.Millisecond)
	if len(got) != 0 {
		t.Fatalf("%d pings while unhealthy", len(got))
	}
	stop()
}

func TestExtendingUntilStopped(t *testing.T) {
	name := filepath.Join(t.TempDir(), "notify")
	got := listenNotify(t, name)
	n := &notifier{socket: name}
	stop := n.Extending(20 * time.Millisecond)
	for range 3 {
		if s := nextNotice(t, got); s != "EXTEND_TIMEOUT_USEC=60000\n" {
			t.Fatalf("sent %q", s)
		}
	}
	stop()
	for len(got) > 0 {
		<-got
	}
	time.Sleep(60 * time.Millisecond)
	if len(got) != 0 {
		t.Fatalf("%d extensions after the stop", len(got))
	}
}

func TestWithoutSocketNothingIsSent(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("INVOCATION_ID", "")
	t.Setenv("WATCHDOG_USEC", "")
	n := notifierFromEnv()
	if n.Watchdog() != 0 {
		t.Fatalf("watchdog %v", n.Watchdog())
	}
	if err := n.Ready(); err != nil {
		t.Fatal(err)
	}
	n.Extending(time.Millisecond)()
	n.KeepAlive(func() bool { return true })()
	var none *notifier
	if err := none.Stopping(); err != nil {
		t.Fatal("a nil notifier sent")
	}
}

func TestRelativeSocketRefused(t *testing.T) {
	n := &notifier{socket: "notify"}
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Fatalf("err %v", err)
	}
}

func TestWatchdogOfAnotherProcessIgnored(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "1000000")
	t.Setenv("WATCHDOG_PID", "1")
	if n := notifierFromEnv(); n.Watchdog() != 0 {
		t.Fatalf("watchdog %v for pid 1", n.Watchdog())
	}
}
