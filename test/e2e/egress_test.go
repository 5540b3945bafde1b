//go:build linux

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The egress tests' world: a network namespace of the test's own, linked
// to the host's by a veth (rrtw0 here, 203.0.113.1/30; eth0 there,
// 203.0.113.2/30), which also holds a link-local address the host routes
// to it (egressMeta): only the policy keeps a unit from it.
const (
	egressHostAddr = "203.0.113.1"
	egressWorld    = "203.0.113.2"
	egressMeta     = "169.254.77.1"
	egressNetns    = "rrtest-world"
)

// egressMetaElse are cloud metadata addresses outside 169.254/16 (Azure's
// wire server, Alibaba Cloud's metadata): the world holds them too, the
// host routes them there, and the daemon's ceiling covers them.
var egressMetaElse = []string{"168.63.129.16", "100.100.100.200"}

// egressWorldNS is the test's world: its servers' counts.
type egressWorldNS struct {
	ns      netns.NsHandle
	streams atomic.Int32 // connections to the stream server
	mu      sync.Mutex
	udp     []string // datagrams the UDP server got
}

func egressCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// inNetns runs f on a thread in ns.
func inNetns(t *testing.T, ns netns.NsHandle, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		own, err := netns.Get()
		if err != nil {
			t.Error(err)
			return
		}
		defer own.Close()
		if err := netns.Set(ns); err != nil {
			t.Error(err)
			return
		}
		f()
		if err := netns.Set(own); err != nil {
			t.Error(err)
			return // the thread dies locked
		}
		runtime.UnlockOSThread()
	}()
	<-done
}

// newEgressWorld makes the world and its servers: HTTP on :8080 and
// :8082, a line every 100 ms on :8081, UDP on :9999. It restores the
// host's IPv4 forwarding setting at the end (a daemon with --egress-allow
// turns it on).
func newEgressWorld(t *testing.T) *egressWorldNS {
	t.Helper()
	// The world's names and addresses, the daemon's links (rrdeN) and its
	// host tables are the machine's: one egress test at a time on it,
	// whatever worktree or TMPDIR runs it.
	lock, err := os.OpenFile("/run/lock/runrecordd-e2e-egress.lock", os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() }) // closing releases the lock
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0) })
	_ = exec.Command("ip", "netns", "del", egressNetns).Run()
	_ = exec.Command("ip", "link", "del", "rrtw0").Run()
	egressCmd(t, "ip", "netns", "add", egressNetns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", egressNetns).Run() })
	egressCmd(t, "ip", "link", "add", "rrtw0", "type", "veth", "peer", "name", "eth0", "netns", egressNetns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "rrtw0").Run() })
	egressCmd(t, "ip", "addr", "add", egressHostAddr+"/30", "dev", "rrtw0")
	egressCmd(t, "ip", "link", "set", "rrtw0", "up")
	egressCmd(t, "ip", "route", "add", egressMeta+"/32", "via", egressWorld)
	egressCmd(t, "ip", "-n", egressNetns, "addr", "add", egressWorld+"/30", "dev", "eth0")
	egressCmd(t, "ip", "-n", egressNetns, "addr", "add", egressMeta+"/32", "dev", "eth0")
	for _, a := range egressMetaElse {
		egressCmd(t, "ip", "route", "add", a+"/32", "via", egressWorld)
		egressCmd(t, "ip", "-n", egressNetns, "addr", "add", a+"/32", "dev", "eth0")
	}
	egressCmd(t, "ip", "-n", egressNetns, "link", "set", "eth0", "up")
	egressCmd(t, "ip", "-n", egressNetns, "link", "set", "lo", "up")
	// The world routes the runs' pool to the host: only the policy keeps
	// it from a sandbox's listeners.
	egressCmd(t, "ip", "-n", egressNetns, "route", "add", "10.254.0.0/16", "via", egressHostAddr)
	ns, err := netns.GetFromName(egressNetns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	w := &egressWorldNS{ns: ns}
	var ls []net.Listener
	var pc net.PacketConn
	inNetns(t, ns, func() {
		for _, p := range []string{"8080", "8081", "8082", "8083"} {
			l, err := net.Listen("tcp4", "0.0.0.0:"+p)
			if err != nil {
				t.Error(err)
				return
			}
			ls = append(ls, l)
		}
		pc, err = net.ListenPacket("udp4", "0.0.0.0:9999")
		if err != nil {
			t.Error(err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		for _, l := range ls {
			l.Close()
		}
		pc.Close()
	})
	for i, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				if i == 3 {
					// egressBulk bytes, in lines of 1 KiB.
					go func() {
						defer c.Close()
						line := append(bytes.Repeat([]byte{'x'}, 1023), '\n')
						for range egressBulk / len(line) {
							if _, err := c.Write(line); err != nil {
								return
							}
						}
					}()
					continue
				}
				if i != 1 {
					fmt.Fprintf(c, "HTTP/1.0 200 OK from the world %s\r\n\r\n", l.Addr())
					c.Close()
					continue
				}
				w.streams.Add(1)
				go func() {
					defer c.Close()
					for n := 1; n <= 1200; n++ {
						if _, err := fmt.Fprintf(c, "%d\n", n); err != nil {
							return
						}
						time.Sleep(100 * time.Millisecond)
					}
				}()
			}
		}()
	}
	go func() {
		b := make([]byte, 1500)
		for {
			n, _, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			w.mu.Lock()
			w.udp = append(w.udp, string(b[:n]))
			w.mu.Unlock()
		}
	}()
	return w
}

// egressBulk is what the world's port 8083 sends each connection.
const egressBulk = 256 << 10

// lastTraffic is the traffic entry of run id's last Executed segment's
// journal; it fails the test without exactly one.
func lastTraffic(t *testing.T, d *daemon, id string) attest.Traffic {
	t.Helper()
	s, err := d.c.Show(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var j *attest.Journal
	for _, seg := range s.Segments {
		if seg.Kind == "executed" {
			_, j = d.journal(t, seg)
		}
	}
	if j == nil {
		t.Fatalf("run %s has no Executed segment", id)
	}
	var out []attest.Traffic
	for _, e := range j.Entries {
		if e.Kind == attest.TrafficKind {
			tr, err := attest.DecodeTraffic(e.Data)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tr)
		}
	}
	if len(out) != 1 {
		t.Fatalf("run %s's last interval has %d traffic entries: %+v", id, len(out), out)
	}
	return out[0]
}

// egressLeft lists what of the runs' links is on the host: links rrde*,
// their chains, and slot files in the daemon's state.
func egressLeft(t *testing.T, d *daemon) []string {
	t.Helper()
	var out []string
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "rrde") {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		shared := map[string]bool{"input": true, "output": true, "postrouting": true, "untracked-in": true, "untracked-out": true}
		if ch.Table.Name == "runrecordd_egress" && !shared[ch.Name] {
			out = append(out, "chain "+ch.Name)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(d.state, "egress"))
	for _, e := range ents {
		out = append(out, "slot file "+e.Name())
	}
	return out
}

// egressHostOf is run id's address on the host (10.254.0.N for its slot
// N, docs/daemon.md).
func egressHostOf(t *testing.T, d *daemon, id string) string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.state, "egress"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(d.state, "egress", e.Name()))
		n, nerr := strconv.Atoi(e.Name())
		if err == nil && nerr == nil && strings.TrimSpace(string(b)) == id {
			return fmt.Sprintf("10.254.%d.%d", n>>8, n&0xff)
		}
	}
	t.Fatalf("run %s holds no egress slot", id)
	return ""
}

// removeEgressHost removes what a daemon with --egress-allow sets up for
// every run on the host (its tables and the pool's blackhole route):
// the test's, not the daemon's, to remove.
func removeEgressHost(t *testing.T) {
	for _, fam := range []string{"ip", "netdev"} {
		_ = exec.Command("nft", "delete", "table", fam, "runrecordd_egress").Run()
	}
	_ = exec.Command("ip", "route", "del", "blackhole", "10.254.0.0/16").Run()
}

// egressGrants are grants of network egress to dests.
func egressGrants(t *testing.T, dests ...string) unit.Grants {
	t.Helper()
	g := unit.Grants{MilliCPU: 1000, MemoryBytes: 128 << 20, Network: unit.Egress}
	for _, s := range dests {
		d, err := unit.ParseDest(s)
		if err != nil {
			t.Fatal(err)
		}
		g.Egress = append(g.Egress, d)
	}
	unit.SortDests(g.Egress)
	return g
}

// said is the rest of each "hostile: ATTACK: " line of run id's stdout.
func said(d *daemon, id, attack string) []string {
	b, _ := os.ReadFile(d.stdout(id))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "hostile: "+attack+": "); ok {
			out = append(out, rest)
		}
	}
	return out
}

// dialResults runs egress-dial as run id under g and returns what it
// said of each address.
func dialResults(t *testing.T, d *daemon, id string, g unit.Grants, addrs ...string) map[string]string {
	t.Helper()
	startHostile(t, d, id, "egress-dial", []string{"HOSTILE_ADDRS=" + strings.Join(addrs, ",")}, g)
	waitSaid(t, d, id, "egress-dial", "done")
	out := map[string]string{}
	for _, l := range said(d, id, "egress-dial") {
		if a, rest, ok := strings.Cut(l, " "); ok {
			out[a] = rest
		}
	}
	return out
}

// TestEgress: a daemon with an egress ceiling links its image units out
// as their grants allow, and nothing else (docs/unit.md, "Grant set"): a
// unit fetches from the world where its grant allows, and is refused
// elsewhere; the host's own addresses, a link-local address, the
// metadata services outside 169.254/16, other sandboxes and a forged
// source are refused though the grant names them; neither the host nor
// the world opens a flow to a sandbox; a flood of new flows stops at the
// run's limit; a connection in flight goes on across a park and resume here,
// and a restart of the daemon; each interval journals the bytes its
// unit fetched, across a restart too, and /metrics sums them; names
// are resolved as the grant lists them, and journaled (testEgressNames); a
// grant beyond the ceiling is refused; and a crash mid-start leaves no
// link, rule or slot after the next start.
func TestEgress(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	w := newEgressWorld(t)
	t.Cleanup(func() { removeEgressHost(t) })
	d := mustDaemon(t, "egress", func(d *daemon) {
		d.flags = []string{"--egress-allow", "203.0.113.0/24", "--egress-allow", "169.254.0.0/16", "--egress-allow", "10.0.0.0/8",
			"--egress-resolver", egressWorld + ":53"}
		for _, a := range egressMetaElse {
			d.flags = append(d.flags, "--egress-allow", a+"/32")
		}
	})
	mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	// The host listens on every address: the unit must not reach it.
	hl, err := net.Listen("tcp4", "0.0.0.0:18090")
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	go func() {
		for {
			c, err := hl.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "HTTP/1.0 200 OK from the host\r\n\r\n")
			c.Close()
		}
	}()
	// What the unit is refused, the host itself reaches: each refusal is
	// the policy's.
	for _, a := range []string{egressHostAddr + ":18090", egressMeta + ":8080", egressMetaElse[0] + ":8080", egressMetaElse[1] + ":8080", egressWorld + ":8082"} {
		c, err := net.DialTimeout("tcp", a, 3*time.Second)
		if err != nil {
			t.Fatalf("the host does not reach %s itself: %v", a, err)
		}
		c.Close()
	}

	t.Run("Ceiling", func(t *testing.T) {
		_, err := d.c.Start(ctx, api.RunRequest{ID: "egress-beyond",
			Unit:   unit.Spec{Image: hostileImage, Env: []string{"HOSTILE=idle"}},
			Grants: egressGrants(t, "192.0.2.0/24:80")})
		apiError(t, err, api.CodeGrantRefused)
		_, err = d.c.Show(ctx, "egress-beyond")
		apiError(t, err, api.CodeNotFound)
	})

	t.Run("AllowedAndNot", func(t *testing.T) {
		got := dialResults(t, d, "egress-allowed", egressGrants(t, egressWorld+"/32:8080-8081"),
			egressWorld+":8080", egressWorld+":8082")
		if !strings.HasPrefix(got[egressWorld+":8080"], "ok HTTP/1.0 200 OK from the world") {
			t.Errorf("the allowed world port: %q", got[egressWorld+":8080"])
		}
		if !strings.HasPrefix(got[egressWorld+":8082"], "refused") {
			t.Errorf("a port the grant does not allow: %q", got[egressWorld+":8082"])
		}
		got = dialResults(t, d, "egress-other", egressGrants(t, "203.0.113.128/25:8080"), egressWorld+":8080")
		if !strings.HasPrefix(got[egressWorld+":8080"], "refused") {
			t.Errorf("a unit whose grant does not name the world: %q", got[egressWorld+":8080"])
		}
	})

	t.Run("Names", func(t *testing.T) { testEgressNames(t, d, w) })

	t.Run("Hostile", func(t *testing.T) {
		startHostile(t, d, "egress-victim", "egress-listen", nil, egressGrants(t, egressWorld+"/32:8080"))
		if l := waitSaid(t, d, "egress-victim", "egress-listen", "listening"); !strings.Contains(l, "ok HTTP/1.0 200 OK") {
			t.Fatalf("the victim does not answer itself: %q", l)
		}
		// The host (an address of its, its side of the link), the
		// link-local range, the metadata services outside it, and the
		// sandboxes' host addresses.
		targets := []string{egressHostAddr + ":18090", "10.255.255.1:18090", egressMeta + ":8080",
			egressMetaElse[0] + ":8080", egressMetaElse[1] + ":8080",
			"10.254.0.1:7000", "10.254.0.2:7000", "10.254.0.3:7000", "10.254.0.4:7000"}
		got := dialResults(t, d, "egress-hostile",
			egressGrants(t, "203.0.113.0/24:1-65535", "169.254.0.0/16:1-65535", "10.0.0.0/8:1-65535",
				egressMetaElse[0]+"/32:1-65535", egressMetaElse[1]+"/32:1-65535"),
			append(targets, egressWorld+":8080")...)
		if !strings.HasPrefix(got[egressWorld+":8080"], "ok ") {
			t.Fatalf("the world, which the grant allows: %q", got[egressWorld+":8080"])
		}
		for _, a := range targets {
			if !strings.HasPrefix(got[a], "refused") {
				t.Errorf("%s: %q, want refused", a, got[a])
			}
		}
		// Nothing new reaches the victim's listeners by its address on
		// the host: not from a process of the host's, not from the
		// world. Its own datagram on loopback does.
		waitSaid(t, d, "egress-victim", "egress-listen", "udp self")
		victim := egressHostOf(t, d, "egress-victim")
		for _, from := range []string{"the host", "the world"} {
			var c net.Conn
			var derr error
			var uerr error
			dialFrom := func() {
				c, derr = net.DialTimeout("tcp4", victim+":7000", 2*time.Second)
				var u net.Conn
				if u, uerr = net.Dial("udp4", victim+":7001"); uerr == nil {
					_, uerr = u.Write([]byte(from))
					u.Close()
				}
			}
			if from == "the host" {
				dialFrom()
			} else {
				inNetns(t, w.ns, dialFrom)
			}
			if derr == nil {
				c.Close()
				t.Errorf("%s reached the victim's TCP listener at %s:7000", from, victim)
			}
			t.Logf("%s to the victim at %s: TCP %v, UDP %v", from, victim, derr, uerr)
		}
		time.Sleep(time.Second)
		for _, l := range said(d, "egress-victim", "egress-listen") {
			if l != "udp self" && strings.HasPrefix(l, "udp ") {
				t.Errorf("the victim got a datagram: %q", l)
			}
		}
		// A flood of new flows, each from a port of its own, stops at
		// the run's limit of 4,096 tracked at once: the world gets no
		// more of them.
		startHostile(t, d, "egress-flood", "egress-flood",
			[]string{"HOSTILE_ADDR=" + egressWorld + ":9999", "HOSTILE_COUNT=5000"},
			egressGrants(t, egressWorld+"/32:9999/udp"))
		waitSaid(t, d, "egress-flood", "egress-flood", "sent 5000")
		time.Sleep(time.Second)
		w.mu.Lock()
		flood := 0
		for _, s := range w.udp {
			if strings.HasPrefix(s, "flood ") {
				flood++
			}
		}
		w.mu.Unlock()
		if flood < 3000 || flood > 4096 {
			t.Errorf("the world got %d of the 5,000 flows, want 3,000 to 4,096", flood)
		}
		t.Logf("the world got %d of the flood's 5,000 flows; egress-flood said %q", flood, said(d, "egress-flood", "egress-flood"))
		// A forged source, from a raw socket, does not leave; the plain
		// datagram does.
		startHostile(t, d, "egress-spoof", "egress-spoof",
			[]string{"HOSTILE_ADDR=" + egressWorld + ":9999", "HOSTILE_SOURCE=10.255.255.3"},
			egressGrants(t, egressWorld+"/32:9999/udp"))
		waitSaid(t, d, "egress-spoof", "egress-spoof", "plain <nil>")
		t.Logf("egress-spoof said %q", said(d, "egress-spoof", "egress-spoof"))
		deadline := time.Now().Add(5 * time.Second)
		for {
			w.mu.Lock()
			udp := append([]string(nil), w.udp...)
			w.mu.Unlock()
			if strings.Contains(strings.Join(udp, ","), "spoofed") {
				t.Fatalf("the world got a datagram with a forged source: %q", udp)
			}
			if strings.Contains(strings.Join(udp, ","), "plain") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the world got no plain datagram: %q", udp)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("ParkInFlight", func(t *testing.T) {
		const id = "egress-stream"
		startHostile(t, d, id, "egress-stream", []string{"HOSTILE_ADDR=" + egressWorld + ":8081"}, egressGrants(t, egressWorld+"/32:8081"))
		waitSaid(t, d, id, "egress-stream", "got 5")
		if _, err := d.c.Park(ctx, id); err != nil {
			t.Fatalf("park: %v", err)
		}
		atPark := len(said(d, id, "egress-stream"))
		time.Sleep(2 * time.Second) // the world writes on meanwhile
		if _, err := d.c.Resume(ctx, id); err != nil {
			t.Fatalf("resume: %v", err)
		}
		waitSaid(t, d, id, "egress-stream", "got "+strconv.Itoa(atPark+30))
		// A restarted daemon (the unit left running) finds the run's
		// slot: the link stays, and a park and resume after it too.
		// Stopped in the lazy window, it would park the run back
		// (docs/lazy-resume.md), so the stop waits for every page.
		waitResident(t, d, id)
		mustStop(t, d)
		mustStart(t, d)
		n := len(said(d, id, "egress-stream"))
		waitSaid(t, d, id, "egress-stream", "got "+strconv.Itoa(n+10))
		if _, err := d.c.Park(ctx, id); err != nil {
			t.Fatalf("park after the restart: %v", err)
		}
		time.Sleep(time.Second)
		if _, err := d.c.Resume(ctx, id); err != nil {
			t.Fatalf("resume after the restart: %v", err)
		}
		waitSaid(t, d, id, "egress-stream", "got "+strconv.Itoa(n+40))
		ls := said(d, id, "egress-stream")
		for i, l := range ls {
			if l != "got "+strconv.Itoa(i+1) {
				t.Fatalf("line %d of the stream across the parks: %q (lines %q)", i+1, l, ls)
			}
		}
		if n := w.streams.Load(); n != 1 {
			t.Fatalf("the world saw %d connections, want the one", n)
		}
		t.Logf("the stream went on across two parks and a restart: %d lines before the first, %d now, one connection", atPark, len(ls))
	})

	t.Run("Traffic", func(t *testing.T) {
		const id = "egress-bytes"
		before := warmMetrics(t, d, "runrecordd_egress_bytes_total")[`runrecordd_egress_bytes_total{direction="in"}`]
		startHostile(t, d, id, "egress-stream", []string{"HOSTILE_ADDR=" + egressWorld + ":8083"}, egressGrants(t, egressWorld+"/32:8083"))
		waitSaid(t, d, id, "egress-stream", "ended EOF")
		if _, err := d.c.Park(ctx, id); err != nil {
			t.Fatalf("park: %v", err)
		}
		first := lastTraffic(t, d, id)
		if first.InBytes < egressBulk || first.OutBytes == 0 || first.InPackets == 0 || first.OutPackets == 0 || first.Reset {
			t.Fatalf("the interval that fetched %d bytes journaled %+v", egressBulk, first)
		}
		if m := warmMetrics(t, d, "runrecordd_egress_bytes_total"); m[`runrecordd_egress_bytes_total{direction="in"}`]-before < egressBulk || m[`runrecordd_egress_bytes_total{direction="out"}`] == 0 {
			t.Fatalf("/metrics after %d bytes in: %v (in was %v)", egressBulk, m, before)
		}
		// The next interval, across a restart of the daemon, fetches
		// nothing: it journals its own traffic, not the run's.
		if _, err := d.c.Resume(ctx, id); err != nil {
			t.Fatalf("resume: %v", err)
		}
		waitResident(t, d, id)
		mustStop(t, d)
		mustStart(t, d)
		if _, err := d.c.Park(ctx, id); err != nil {
			t.Fatalf("park after the restart: %v", err)
		}
		if second := lastTraffic(t, d, id); second.InBytes >= egressBulk/4 || second.Reset {
			t.Fatalf("an interval that fetched nothing journaled %+v (the first %+v)", second, first)
		}
		t.Logf("traffic journaled: %+v, then %+v", first, lastTraffic(t, d, id))
	})

	t.Run("CrashMidStart", func(t *testing.T) {
		mustStop(t, d)
		d.env = []string{failpoint.Env + "=start.sandboxed"}
		err := d.start()
		d.env = nil
		if err != nil {
			t.Fatal(err)
		}
		_, err = d.c.Start(ctx, api.RunRequest{ID: "egress-crash",
			Unit:   unit.Spec{Image: hostileImage, Env: []string{"HOSTILE=idle"}},
			Grants: egressGrants(t, egressWorld+"/32:8080")})
		if err == nil {
			t.Fatal("the start armed to crash answered")
		}
		crashKilled(t, d, "start.sandboxed")
		mustStart(t, d)
		if _, err := d.c.Show(ctx, "egress-crash"); err == nil {
			t.Fatal("the crashed start has a run")
		}
	})

	// Every run closed, nothing of their links is left.
	if err := d.closeAll(ctx); err != nil {
		t.Fatal(err)
	}
	if left := egressLeft(t, d); len(left) > 0 {
		t.Fatalf("left after every run closed: %v", left)
	}
}
