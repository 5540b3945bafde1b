package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A start whose egress grant this host does not give is refused before
// anything is made: no ceiling, beyond it, by name, a transcript unit, and
// a host that links nothing out.
func TestStartEgressRefused(t *testing.T) {
	grants := func(ds ...unit.Dest) unit.Grants { return unit.Grants{Network: unit.Egress, Egress: ds} }
	world := unit.Dest{CIDR: "203.0.113.0/24", Proto: "tcp", Ports: "443"}
	pypi := unit.Dest{Name: "pypi.org", Proto: "tcp", Ports: "443"}
	all := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	image := unit.Spec{Image: fakeImage, Args: []string{"/unit"}}
	for _, c := range []struct {
		name    string
		ceiling []netip.Prefix
		names   bool // the host has an upstream resolver
		spec    unit.Spec
		grants  unit.Grants
		want    error
	}{
		{"no ceiling", nil, false, image, grants(world), bundle.ErrPolicy},
		{"beyond", []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, false, image, grants(world), bundle.ErrPolicy},
		{"by name, no resolver", all, false, image, grants(world, pypi), bundle.ErrPolicy},
		// Past the judge of its grant, to the links this fake host has not.
		{"by name, a resolver", all, true, image, grants(world, pypi), forms.ErrNoEgress},
		{"transcript", []netip.Prefix{netip.MustParsePrefix("203.0.0.0/8")}, false, unit.Spec{Image: fakeImage, Mode: unit.TranscriptMode}, grants(world), answers.ErrInvalid},
		{"no links", []netip.Prefix{netip.MustParsePrefix("203.0.0.0/8")}, false, image, grants(world), forms.ErrNoEgress},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newFakeHost(t, func(d *Daemon) {
				d.cfg.EgressAllow = c.ceiling
				if c.names {
					d.cfg.EgressResolver = netip.MustParseAddrPort("192.0.2.53:53")
				}
			})
			_, err := h.d.Start(t.Context(), "r", c.spec, c.grants)
			if !errors.Is(err, c.want) {
				t.Fatalf("start: %v, want %v", err, c.want)
			}
			if h.ex.starts != 0 {
				t.Fatalf("%d sandboxes started", h.ex.starts)
			}
			if _, err := h.d.st.Run("r"); err == nil {
				t.Fatal("the refused start has a run")
			}
		})
	}
	// Within the ceiling, the loopback and none grants are as before.
	h := newFakeHost(t)
	if _, err := h.d.Start(t.Context(), "lo", image, unit.Grants{Network: unit.Loopback}); err != nil {
		t.Fatal(err)
	}
}

// A link is judged against the ceiling now, whatever admitted the run: a
// run granted more under a wider ceiling (a restart since, or a run that
// came back, whose import does not judge its grants again) is refused
// its link beyond it, before a slot is taken.
func TestLinkWithinCeiling(t *testing.T) {
	l := &links{ceiling: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, slot: map[string]int{}, runs: map[string]*egress.Run{}}
	_, err := l.Link("r", []unit.Dest{{CIDR: "0.0.0.0/0", Proto: "tcp", Ports: "1-65535"}}, false)
	if !errors.Is(err, bundle.ErrPolicy) || len(l.slot) != 0 {
		t.Fatalf("a link beyond the ceiling: %v; slots %v", err, l.slot)
	}
}

// testNetns is a network namespace of the test's own, by path.
func testNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace, links and nftables")
	}
	type made struct {
		ns  netns.NsHandle
		err error
	}
	c := make(chan made, 1)
	go func() {
		runtime.LockOSThread()
		own, err := netns.Get()
		if err != nil {
			c <- made{err: err}
			return
		}
		defer own.Close()
		ns, err := netns.New()
		if serr := netns.Set(own); serr != nil {
			c <- made{err: errors.Join(err, serr)}
			return // the thread dies locked
		}
		runtime.UnlockOSThread()
		c <- made{ns, err}
	}()
	m := <-c
	if m.err != nil {
		t.Fatal(m.err)
	}
	t.Cleanup(func() { m.ns.Close() })
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(m.ns))
}

// A park's hold: the slot file says when the run parked; a restore
// within the hold keeps its connections; at the hold's end its tracked
// connections are removed, and a restore after it closes them
// (Expired), across a restart too; a restore with a slot taken for it
// closes them (Elsewhere); a pass ends the park.
func TestParkHold(t *testing.T) {
	gw, err := egress.Open(egress.Config{HostNetns: testNetns(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	dir := t.TempDir()
	const hold = 300 * time.Millisecond
	ceiling := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	l, err := loadLinks(gw, dir, ceiling, hold, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	forgot := make(chan int, 4)
	l.forget = func(slot int) error { forgot <- slot; return nil }
	allow := []unit.Dest{{CIDR: "198.51.100.0/24", Proto: "tcp", Ports: "443"}}
	if _, err := l.Link("r", allow, false); err != nil {
		t.Fatal(err)
	}
	reset := func(l *links, run string, fresh bool) egress.Reset {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.resetFor(run, fresh, time.Now())
	}
	if err := l.Unlink("r"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "1")); err != nil || !strings.HasPrefix(string(b), "r\nparked ") {
		t.Fatalf("the slot file of a parked run: %q, %v", b, err)
	}
	if why := reset(l, "r", false); why != egress.Keep {
		t.Fatalf("a restore within the hold: %d, want Keep", why)
	}
	select {
	case s := <-forgot:
		if s != 1 {
			t.Fatalf("the hold's end forgot slot %d", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the hold did not end")
	}
	if why := reset(l, "r", false); why != egress.Expired {
		t.Fatalf("a restore after the hold: %d, want Expired", why)
	}
	if why := reset(l, "other", true); why != egress.Elsewhere {
		t.Fatalf("a restore with a slot taken for it: %d, want Elsewhere", why)
	}
	// A restarted daemon counts the hold from the park still.
	l2, err := loadLinks(gw, dir, ceiling, hold, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if why := reset(l2, "r", false); why != egress.Expired {
		t.Fatalf("after a restart, a restore after the hold: %d, want Expired", why)
	}
	if _, err := l2.Link("r", allow, true); err != nil {
		t.Fatal(err)
	}
	if err := l2.Pass("r"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "1")); err != nil || string(b) != "r\n" {
		t.Fatalf("the slot file after the pass: %q, %v", b, err)
	}
	if why := reset(l2, "r", false); why != egress.Keep {
		t.Fatalf("after the pass: %d, want Keep", why)
	}
	l2.Release("r")
	if _, err := os.Stat(filepath.Join(dir, "1")); !os.IsNotExist(err) {
		t.Fatalf("the slot file after the release: %v", err)
	}
}

// A restore's closed entry is journaled before any connection it lists
// is closed: Closing hands it over with the connection still open, and
// a daemon that dies before its Pass leaves the link held, which the
// restarted daemon's Reheld passes, closing the connections the journal
// it finds says were to be closed, and none where it holds no closed
// entry (the crash came before Closing).
func TestClosedJournaledFirst(t *testing.T) {
	host := testNetns(t)
	gw, err := egress.Open(egress.Config{HostNetns: host})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	dir := t.TempDir()
	ceiling := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	allow := []unit.Dest{{CIDR: "198.51.100.0/24", Proto: "tcp", Ports: "443"}}
	l, err := loadLinks(gw, dir, ceiling, time.Hour, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	sb := testNetns(t)
	// A restore, here with a slot taken for it (Elsewhere), held.
	restore := func(l *links) {
		t.Helper()
		l.Release("r")
		link, err := l.Link("r", allow, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := link(sb); err != nil {
			t.Fatal(err)
		}
	}
	restart := func() *links {
		t.Helper()
		l, err := loadLinks(gw, dir, ceiling, time.Hour, slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// The crash comes before Closing: the journal holds no closed entry,
	// and the restarted daemon passes the link, closing nothing.
	restore(l)
	c := outsideConn(t, sb)
	l = restart()
	if err := l.Reheld("r", allow, sb, nil); err != nil {
		t.Fatal(err)
	}
	if err := stillOpen(c); err != nil {
		t.Fatalf("passed after a crash before Closing: %v", err)
	}
	if held, _, err := gw.Held(1); err != nil || held {
		t.Fatalf("the link after Reheld: held %v, %v", held, err)
	}

	// The crash comes after Closing journaled the entry.
	restore(l)
	var es []attest.Entry
	err = l.Closing("r", func(e attest.Entry) error {
		if err := stillOpen(c); err != nil {
			t.Errorf("a connection closed before its entry was journaled: %v", err)
		}
		es = append(es, e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Kind != attest.ClosedKind {
		t.Fatalf("journaled %+v, want one closed entry", es)
	}
	got, err := attest.DecodeClosed(es[0].Data)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	want := attest.ClosedConn{Local: local, Remote: netip.MustParseAddrPort(c.RemoteAddr().String())}
	if err != nil || got.Reason != attest.ClosedElsewhere || got.Total != 1 || len(got.Conns) != 1 || got.Conns[0] != want {
		t.Fatalf("the closed entry: %+v, %v; want %+v", got, err, want)
	}
	if err := stillOpen(c); err != nil {
		t.Fatalf("journaled, not passed: %v", err)
	}
	l = restart()
	if err := l.Reheld("r", allow, sb, es); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNABORTED) {
		t.Fatalf("the listed connection after the restarted daemon's pass: %v, want ECONNABORTED", err)
	}
	if held, _, err := gw.Held(1); err != nil || held {
		t.Fatalf("the link after Reheld: held %v, %v", held, err)
	}

	// Closing whose journal fails closes nothing at the pass.
	restore(l)
	c = outsideConn(t, sb)
	if err := l.Closing("r", func(attest.Entry) error { return errors.New("disk full") }); err == nil {
		t.Fatal("Closing with a failed journal: no error")
	}
	if err := l.Pass("r"); err != nil {
		t.Fatal(err)
	}
	if err := stillOpen(c); err != nil {
		t.Fatalf("closed with its entry not journaled: %v", err)
	}
	l.Release("r")
}

// outsideConn is a TCP connection of sandbox sb to outside as a restore
// lists one: from its address to 198.51.100.7, served in sb itself (on
// a link of its own), so that it needs no world.
func outsideConn(t *testing.T, sb string) net.Conn {
	t.Helper()
	var c net.Conn
	var ln net.Listener
	err := inNetns(sb, func(h *netlink.Handle) error {
		if _, err := h.LinkByName("outside0"); err != nil {
			lo, err := h.LinkByName("lo")
			if err == nil {
				err = h.LinkSetUp(lo)
			}
			d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "outside0"}, PeerName: "outside1"}
			if err == nil {
				err = h.LinkAdd(d)
			}
			if err == nil {
				err = h.AddrAdd(d, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 51, 100, 7), Mask: net.CIDRMask(32, 32)}})
			}
			if err == nil {
				err = h.LinkSetUp(d)
			}
			if err != nil {
				return err
			}
		}
		var err error
		if ln, err = net.Listen("tcp4", "198.51.100.7:0"); err != nil {
			return err
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: egress.SandboxAddr.AsSlice()}}
		c, err = d.Dial("tcp4", ln.Addr().String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	t.Cleanup(func() { c.Close(); peer.Close() })
	return c
}

// stillOpen says whether c, idle, is still open: a read waits.
func stillOpen(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("read: %v", err)
	}
	return nil
}

// inNetns runs f on a thread in the network namespace at path, with a
// netlink handle there.
func inNetns(path string, f func(*netlink.Handle) error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		defer own.Close()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			done <- err
			return
		}
		defer h.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		err = f(h)
		if serr := netns.Set(own); serr != nil {
			done <- errors.Join(err, serr)
			return // the thread dies locked
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}
