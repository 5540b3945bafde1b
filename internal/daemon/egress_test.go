package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/internal/forms"
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
	if _, err := l2.Pass("r"); err != nil {
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
