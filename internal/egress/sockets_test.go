package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// sandboxConns are a sandbox's connections of every kind Pass tells
// apart: one to the world, one over loopback, one to its own address,
// and their listeners.
type sandboxConns struct {
	world, lo, own net.Conn
}

func connect(t *testing.T, ns netns.NsHandle) sandboxConns {
	t.Helper()
	serve(t, ns, "127.0.0.1:7000")
	serve(t, ns, SandboxAddr.String()+":7001")
	var out sandboxConns
	var err error
	for _, c := range []struct {
		to  string
		set *net.Conn
	}{{worldIP + ":8080", &out.world}, {"127.0.0.1:7000", &out.lo}, {SandboxAddr.String() + ":7001", &out.own}} {
		if *c.set, _, err = dial(ns, "", c.to); err != nil {
			t.Fatalf("%s: %v", c.to, err)
		}
		t.Cleanup(func() { (*c.set).Close() })
	}
	return out
}

// echoes says whether c still echoes a line.
func echoes(c net.Conn, msg string) error {
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && got != msg+"\n" {
		err = fmt.Errorf("read %q", got)
	}
	return err
}

// aborted waits for c to fail as a destroyed socket does.
func aborted(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	t0 := time.Now()
	_, err := c.Read(make([]byte, 64))
	if !errors.Is(err, syscall.ECONNABORTED) {
		t.Fatalf("the connection to outside after the pass: %v, want ECONNABORTED", err)
	}
	t.Logf("the unit's read failed %s after the pass: %v", time.Since(t0), err)
}

// wantClosed checks what a Pass closed: the world connection alone, for
// why.
func wantClosed(t *testing.T, got Closed, why Reset, c net.Conn) {
	t.Helper()
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	want := Conn{Local: local, Remote: netip.MustParseAddrPort(worldIP + ":8080")}
	if got.Why != why || len(got.Conns) != 1 || got.Conns[0] != want {
		t.Fatalf("closed %+v, want %d and %+v", got, why, want)
	}
}

// A run restored where nothing of its connections is kept (another host:
// here a run of another slot, the first one closed, as a handed-off run
// is) has its connection to outside aborted at Pass, not before, and
// its loopback connections, those to its own address and its listeners
// kept; a new connection out works.
func TestResetElsewhere(t *testing.T) {
	w := newWorld(t, Config{})
	serve(t, w.wns, worldIP+":8080")
	r, s1 := w.sandbox(1, worldIP+"/32:8080")
	cs := connect(t, s1)
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	allow := []unit.Dest{{CIDR: worldIP + "/32", Proto: "tcp", Ports: "8080"}}
	r2, err := w.host.Allow(2, allow)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	r2.Restore(Elsewhere)
	if err := r2.Attach(nsPath(s1)); err != nil {
		t.Fatal(err)
	}
	// Held until the pass: the socket is as the restore left it.
	cs.world.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := cs.world.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("before the pass: %v", err)
	}
	got, err := r2.Pass()
	if err != nil {
		t.Fatal(err)
	}
	wantClosed(t, got, Elsewhere, cs.world)
	aborted(t, cs.world)
	for name, c := range map[string]net.Conn{"loopback": cs.lo, "own address": cs.own} {
		if err := echoes(c, "kept"); err != nil {
			t.Errorf("the %s connection after the pass: %v", name, err)
		}
	}
	if c, _, err := dial(s1, "", "127.0.0.1:7000"); err != nil {
		t.Errorf("the listener after the pass: %v", err)
	} else {
		c.Close()
	}
	if c, _, err := dial(s1, "", worldIP+":8080"); err != nil {
		t.Errorf("a new connection out after the pass: %v", err)
	} else {
		c.Close()
	}
	if again, err := r2.Pass(); err != nil || again.Why != Keep || len(again.Conns) != 0 {
		t.Fatalf("a second pass: %+v, %v", again, err)
	}
}

// What a Pass closes is listed first (ToClose) while the connections
// are still open, so that the caller journals them before any is closed.
// A process that dies between the two leaves the link held, Held says
// so and why, and the run adopted by the next process (Reheld) closes
// them at its Pass, keeping the rest.
func TestToCloseThenCrash(t *testing.T) {
	w := newWorld(t, Config{})
	serve(t, w.wns, worldIP+":8080")
	r, s1 := w.sandbox(1, worldIP+"/32:8080")
	cs := connect(t, s1)
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	allow := []unit.Dest{{CIDR: worldIP + "/32", Proto: "tcp", Ports: "8080"}}
	r2, err := w.host.Allow(2, allow)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	r2.Restore(Elsewhere)
	if err := r2.Attach(nsPath(s1)); err != nil {
		t.Fatal(err)
	}
	listed, err := r2.ToClose()
	if err != nil {
		t.Fatal(err)
	}
	wantClosed(t, listed, Elsewhere, cs.world)
	// Listed, not closed: the socket is as the restore left it.
	cs.world.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := cs.world.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("listed, before the pass: %v", err)
	}
	// The process dies here: r2 is not used again.
	held, why, err := w.host.Held(2)
	if err != nil || !held || why != Elsewhere {
		t.Fatalf("the link after the crash: held %v, %d, %v; want held, Elsewhere", held, why, err)
	}
	a, err := w.host.Adopt(2, allow)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Reheld(nsPath(s1), why); err != nil {
		t.Fatal(err)
	}
	got, err := a.Pass()
	if err != nil {
		t.Fatal(err)
	}
	wantClosed(t, got, Elsewhere, cs.world)
	aborted(t, cs.world)
	if err := echoes(cs.lo, "kept"); err != nil {
		t.Errorf("the loopback connection: %v", err)
	}
	if held, _, err := w.host.Held(2); err != nil || held {
		t.Fatalf("the link after the pass: held %v, %v", held, err)
	}
	if c, _, err := dial(s1, "", worldIP+":8080"); err != nil {
		t.Errorf("a new connection out after the pass: %v", err)
	} else {
		c.Close()
	}
}

// A park's hold ended (Forget): the run's tracked connections are gone
// from the host, the world's next segment is answered with a reset by
// the host, and the resume (Restore(Expired)) aborts the unit's end.
func TestForgetThenExpired(t *testing.T) {
	w := newWorld(t, Config{})
	serve(t, w.wns, worldIP+":8080")
	r, s1 := w.sandbox(1, worldIP+"/32:8080")
	cs := connect(t, s1)
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	if n := w.flows(1); n == 0 {
		t.Fatal("no tracked connection of the parked run")
	}
	if err := w.host.Forget(1); err != nil {
		t.Fatal(err)
	}
	if n := w.flows(1); n != 0 {
		t.Fatalf("%d tracked connections of the run after Forget", n)
	}
	r.Restore(Expired)
	if err := r.Attach(nsPath(s1)); err != nil {
		t.Fatal(err)
	}
	got, err := r.Pass()
	if err != nil {
		t.Fatal(err)
	}
	wantClosed(t, got, Expired, cs.world)
	aborted(t, cs.world)
	if err := echoes(cs.lo, "kept"); err != nil {
		t.Errorf("the loopback connection: %v", err)
	}
}

// A restore on this host whose rules are gone (the host restarted since
// the park) keeps nothing of its connections: Keep becomes Elsewhere.
func TestResetWhenRulesGone(t *testing.T) {
	w := newWorld(t, Config{})
	serve(t, w.wns, worldIP+":8080")
	r, s1 := w.sandbox(1, worldIP+"/32:8080")
	cs := connect(t, s1)
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := w.host.Reconcile(func(int) bool { return false }); err != nil {
		t.Fatal(err)
	}
	a, err := w.host.Adopt(1, []unit.Dest{{CIDR: worldIP + "/32", Proto: "tcp", Ports: "8080"}})
	if err != nil {
		t.Fatal(err)
	}
	a.Restore(Keep)
	if err := a.Attach(nsPath(s1)); err != nil {
		t.Fatal(err)
	}
	got, err := a.Pass()
	if err != nil {
		t.Fatal(err)
	}
	wantClosed(t, got, Elsewhere, cs.world)
	aborted(t, cs.world)
}

// Two Gateways in one namespace, with pools and link prefixes apart,
// keep their links, tables and tracked connections apart: each run
// reaches the world, the world sees them apart, and one Gateway's
// reconcile of everything leaves the other's run as it was.
func TestTwoGateways(t *testing.T) {
	w := newWorld(t, Config{})
	serve(t, w.wns, worldIP+":8080")
	h2, err := Open(Config{HostNetns: w.hostP, Pool: netip.MustParsePrefix("10.253.0.0/24"), LinkPrefix: "rrdx"})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	_, s1 := w.sandbox(1, worldIP+"/32:8080")
	allow := []unit.Dest{{CIDR: worldIP + "/32", Proto: "tcp", Ports: "8080"}}
	r2, err := h2.Allow(1, allow)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	s2, p2 := newNetns(t)
	if err := r2.Attach(p2); err != nil {
		t.Fatal(err)
	}
	if r2.Link() != "rrdx1" || h2.table != tableName+"_rrdx" {
		t.Fatalf("the second gateway's link %s, table %s", r2.Link(), h2.table)
	}
	local := SandboxAddr.String() + ":40000"
	c1, seen1, err := dial(s1, local, worldIP+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, seen2, err := dial(s2, local, worldIP+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if seen1 == seen2 {
		t.Fatalf("the world saw both runs as %s", seen1)
	}
	if err := h2.Reconcile(func(int) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if err := echoes(c1, "the first gateway's run"); err != nil {
		t.Fatalf("after the second gateway's reconcile: %v", err)
	}
	if _, err := w.host.nl.LinkByName("rrde1"); err != nil {
		t.Fatalf("the first gateway's link: %v", err)
	}
	if n := w.flows(1); n == 0 {
		t.Fatal("the first gateway's run lost its tracked connection")
	}
	for _, p := range []string{"rrde1", "RRDE", "abcdefghijk", "rr-x"} {
		if _, err := Open(Config{HostNetns: w.hostP, LinkPrefix: p}); !errors.Is(err, ErrInvalid) {
			t.Errorf("link prefix %q: %v, want ErrInvalid", p, err)
		}
	}
}

func nsPath(ns netns.NsHandle) string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns)) }

// flows counts the host's tracked connections of slot.
func (w *world) flows(slot int) int {
	w.t.Helper()
	fs, err := w.host.nl.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		w.t.Fatal(err)
	}
	n := 0
	f := flowsOf(func(s int) bool { return s == slot }, w.host)
	for _, fl := range fs {
		if f.MatchConntrackFlow(fl) {
			n++
		}
	}
	return n
}
