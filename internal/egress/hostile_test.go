package egress

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The attacks of a hostile unit with an egress grant (docs/unit.md, "What
// an egress grant gives"), each with a check that the test is not blind:
// the same packet, or the same path, works where the policy does not
// stand in its way.

// inWorld gives the world address a too, and routes it there from the
// host: only the policy keeps a sandbox from it.
func (w *world) inWorld(a string) {
	w.t.Helper()
	nl, err := netlink.NewHandleAt(w.wns)
	if err != nil {
		w.t.Fatal(err)
	}
	defer nl.Close()
	wo, err := nl.LinkByName("wo0")
	if err != nil {
		w.t.Fatal(err)
	}
	mustNL(w.t, nl.AddrAdd(wo, &netlink.Addr{IPNet: prefixNet(netip.MustParsePrefix(a + "/32"))}))
	mustNL(w.t, w.host.nl.RouteAdd(&netlink.Route{Dst: prefixNet(netip.MustParsePrefix(a + "/32")), Gw: net.ParseIP(worldIP)}))
}

// Cloud metadata services outside 169.254/16 are refused though the grant
// allows every address.
func TestMetadataAddresses(t *testing.T) {
	w := newWorld(t, Config{})
	addrs := []string{"168.63.129.16", "100.100.100.200"}
	for _, a := range addrs {
		w.inWorld(a)
		serve(t, w.wns, a+":80")
		c, _, err := dial(w.hns, "", a+":80")
		if err != nil {
			t.Fatalf("the host does not reach %s itself: %v", a, err)
		}
		c.Close()
	}
	serve(t, w.wns, worldIP+":80")
	_, s1 := w.sandbox(1, "0.0.0.0/0:1-65535")
	c, _, err := dial(s1, "", worldIP+":80")
	if err != nil {
		t.Fatalf("the world, which the grant allows: %v", err)
	}
	c.Close()
	for _, a := range addrs {
		if c, seen, err := dial(s1, "", a+":80"); err == nil {
			c.Close()
			t.Errorf("the metadata address %s was reached, seen as %s", a, seen)
		}
	}
}

// listenUDP listens on addr in namespace ns and passes on what it gets.
func listenUDP(t *testing.T, ns netns.NsHandle, addr string) <-chan string {
	t.Helper()
	var pc net.PacketConn
	err := inNetns(ns, func() (err error) { pc, err = net.ListenPacket("udp4", addr); return err })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	got := make(chan string, 16)
	go func() {
		b := make([]byte, 1500)
		for {
			n, _, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			select {
			case got <- string(b[:n]):
			default:
			}
		}
	}()
	return got
}

// sendUDP sends payload to addr from namespace ns.
func sendUDP(ns netns.NsHandle, addr, payload string) error {
	return inNetns(ns, func() error {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
}

// received says whether want came on got within dialFor.
func received(got <-chan string, want string) bool {
	deadline := time.After(dialFor)
	for {
		select {
		case s := <-got:
			if s == want {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// Nothing new reaches a sandbox: not a process of the host, not the
// world, not over TCP nor UDP, by the run's address on the host.
func TestNothingReachesTheSandbox(t *testing.T) {
	w := newWorld(t, Config{})
	r, s1 := w.sandbox(1, worldIP+"/32:1-65535", worldIP+"/32:1-65535/udp")
	serve(t, s1, "0.0.0.0:7000")
	got := listenUDP(t, s1, "0.0.0.0:7001")
	// The sandbox's own listeners answer, and its datagrams leave.
	c, _, err := dial(s1, "", "127.0.0.1:7000")
	if err != nil {
		t.Fatalf("the sandbox's own listener: %v", err)
	}
	c.Close()
	world := listenUDP(t, w.wns, worldIP+":7001")
	if err := sendUDP(s1, worldIP+":7001", "out"); err != nil || !received(world, "out") {
		t.Fatalf("the sandbox's datagram to the world: %v: the check is blind", err)
	}
	// The world routes the pool to the host.
	wnl, err := netlink.NewHandleAt(w.wns)
	if err != nil {
		t.Fatal(err)
	}
	defer wnl.Close()
	mustNL(t, wnl.RouteAdd(&netlink.Route{Dst: prefixNet(w.host.pool), Gw: net.ParseIP(hostUp)}))
	to := r.Addr().String()
	for _, from := range []struct {
		what string
		ns   netns.NsHandle
	}{{"the host", w.hns}, {"the world", w.wns}} {
		if c, seen, err := dial(from.ns, "", to+":7000"); err == nil {
			c.Close()
			t.Errorf("%s reached the sandbox's listener at %s:7000, seen as %s", from.what, to, seen)
		}
		// Refused at the send (EPERM, the host's output chain) or
		// dropped on the way.
		msg := "from " + from.what
		if err := sendUDP(from.ns, to+":7001", msg); err == nil && received(got, msg) {
			t.Errorf("%s's datagram to %s:7001 reached the sandbox", from.what, to)
		}
	}
}

// ipv4UDP is an IPv4 packet from src to dst holding a UDP datagram of
// payload from port 40000 to port, its header checksum set (the UDP one
// left zero, as IPv4 allows).
func ipv4UDP(src, dst netip.Addr, port uint16, payload string) []byte {
	udp := binary.BigEndian.AppendUint16(nil, 40000)
	udp = binary.BigEndian.AppendUint16(udp, port)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(payload)))
	udp = append(udp, 0, 0)
	udp = append(udp, payload...)
	ip := []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, unix.IPPROTO_UDP, 0, 0}
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	s, d := src.As4(), dst.As4()
	ip = append(append(ip, s[:]...), d[:]...)
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	return append(ip, udp...)
}

// checksum is the Internet checksum of b.
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		sum += uint32(b[i]) << 8
		if i+1 < len(b) {
			sum += uint32(b[i+1])
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// sendFrame sends an Ethernet frame of type proto holding payload from
// namespace ns's eth0 to the link-layer address to.
func sendFrame(ns netns.NsHandle, to net.HardwareAddr, proto uint16, payload []byte) error {
	return inNetns(ns, func() error {
		l, err := net.InterfaceByName(sandboxLink)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		frame := append(append(append([]byte(nil), to...), l.HardwareAddr...), byte(proto>>8), byte(proto))
		frame = append(frame, payload...)
		sa := &unix.SockaddrLinklayer{Protocol: proto<<8 | proto>>8, Ifindex: l.Index, Halen: 6}
		copy(sa.Addr[:], to)
		return unix.Sendto(fd, frame, 0, sa)
	})
}

// A unit making its own frames for the gateway reaches no address of the
// host's: not loopback (refused by the input chain where the host routes
// it), not its uplink's, not the gateway's, no broadcast. The same frame for the
// world, which its grant allows, arrives.
func TestFramesToTheHost(t *testing.T) {
	w := newWorld(t, Config{})
	r, s1 := w.sandbox(1, worldIP+"/32:9999/udp", "0.0.0.0/0:9999/udp")
	hl, err := w.host.nl.LinkByName(r.Link())
	if err != nil {
		t.Fatal(err)
	}
	gw := hl.Attrs().HardwareAddr
	world := listenUDP(t, w.wns, worldIP+":9999")
	if err := sendFrame(s1, gw, unix.ETH_P_IP, ipv4UDP(SandboxAddr, netip.MustParseAddr(worldIP), 9999, "made")); err != nil {
		t.Fatal(err)
	}
	if !received(world, "made") {
		t.Fatal("the unit's own frame for the world did not arrive: the check is blind")
	}
	// As some hosts have it (Kubernetes' kube-proxy sets it): loopback
	// addresses routed from other interfaces. The input chain refuses.
	mustNL(t, inNetns(w.hns, func() error { return sysctl("net/ipv4/conf/all/route_localnet", "1") }))
	loop := listenUDP(t, w.hns, "127.0.0.1:9999")
	any := listenUDP(t, w.hns, "0.0.0.0:9998")
	for _, tc := range []struct {
		to   string
		port uint16
		got  <-chan string
	}{
		{"127.0.0.1", 9999, loop},
		{hostUp, 9998, any},
		{GatewayAddr.String(), 9998, any},
		{"10.255.255.3", 9998, any}, // the link's broadcast address
		{"255.255.255.255", 9998, any},
	} {
		msg := "to " + tc.to
		if err := sendFrame(s1, gw, unix.ETH_P_IP, ipv4UDP(SandboxAddr, netip.MustParseAddr(tc.to), tc.port, msg)); err != nil {
			t.Fatal(err)
		}
		if received(tc.got, msg) {
			t.Errorf("a frame from the sandbox reached the host's %s:%d", tc.to, tc.port)
		}
	}
}

// ip6Received is how many IPv6 packets namespace ns's IPv6 stack has
// received on its interface link (its Ip6InReceives, counted before the
// interface's disable_ipv6 is looked at; per interface, so a router
// solicitation or report of another link's is not counted).
func ip6Received(t *testing.T, ns netns.NsHandle, link string) uint64 {
	t.Helper()
	var n uint64
	err := inNetns(ns, func() error {
		f, err := os.Open("/proc/thread-self/net/dev_snmp6/" + link)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "Ip6InReceives" {
				n, err = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				return err
			}
		}
		return errors.Join(sc.Err(), errors.New("no Ip6InReceives"))
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// icmp6Echo is an IPv6 packet from fe80::1 to ff02::1 (every node of the
// link) holding an ICMPv6 echo request, its checksum set.
func icmp6Echo() []byte {
	src := netip.MustParseAddr("fe80::1").As16()
	dst := netip.MustParseAddr("ff02::1").As16()
	icmp := []byte{128, 0, 0, 0, 0x52, 0x52, 0, 1, 'r', 'r', 'd'}
	pseudo := append(append(append([]byte(nil), src[:]...), dst[:]...), 0, 0, 0, byte(len(icmp)), 0, 0, 0, unix.IPPROTO_ICMPV6)
	binary.BigEndian.PutUint16(icmp[2:], checksum(append(pseudo, icmp...)))
	ip := []byte{0x60, 0, 0, 0, 0, byte(len(icmp)), unix.IPPROTO_ICMPV6, 255}
	ip = append(append(append(ip, src[:]...), dst[:]...), icmp...)
	return ip
}

// No IPv6 leaves a sandbox: a unit's own IPv6 frames (an echo to every
// node of the link, from a link-local address) never reach the host's
// IPv6 stack. The same frames over a plain link do.
func TestNoIPv6(t *testing.T) {
	w := newWorld(t, Config{})
	r1, s1 := w.sandbox(1, worldIP+"/32:8080")
	allNodes := net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	// The control: a plain link from a namespace of its own.
	plain, _ := newNetns(t)
	nl, err := netlink.NewHandleAt(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	la := netlink.NewLinkAttrs()
	la.Name = sandboxLink
	peer, _ := newNetns(t)
	mustNL(t, nl.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "plain0", PeerNamespace: netlink.NsFd(int(peer))}))
	l, err := nl.LinkByName(sandboxLink)
	if err != nil {
		t.Fatal(err)
	}
	mustNL(t, nl.LinkSetUp(l))
	pnl, err := netlink.NewHandleAt(peer)
	if err != nil {
		t.Fatal(err)
	}
	defer pnl.Close()
	pl, err := pnl.LinkByName("plain0")
	if err != nil {
		t.Fatal(err)
	}
	mustNL(t, pnl.LinkSetUp(pl))
	mustNL(t, errors.Join(waitActive(nl, sandboxLink), waitActive(pnl, "plain0")))
	before := ip6Received(t, peer, "plain0")
	if err := sendFrame(plain, allNodes, unix.ETH_P_IPV6, icmp6Echo()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if ip6Received(t, peer, "plain0") == before {
		t.Fatal("the echo over a plain link did not reach its peer's IPv6 stack: the check is blind")
	}
	before = ip6Received(t, w.hns, r1.Link())
	for range 3 {
		if err := sendFrame(s1, allNodes, unix.ETH_P_IPV6, icmp6Echo()); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if n := ip6Received(t, w.hns, r1.Link()); n != before {
		t.Fatalf("IPv6 from the sandbox reached the host's IPv6 stack: %d packets", n-before)
	}
}

// nfConntrackMax is the host's conntrack table size, as namespace ns
// reads it.
func nfConntrackMax(t *testing.T, ns netns.NsHandle) int {
	t.Helper()
	var n int
	err := inNetns(ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_max")
		if err == nil {
			n, err = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// quarterShares is a Gateway whose runs' connection limit is a quarter of
// the host's conntrack table (max), with runs 1 and 2 allowed dests d:
// the share is full. All of it closes with t.
func quarterShares(t *testing.T) (h *Gateway, d []unit.Dest, max int, r1 *Run) {
	t.Helper()
	w := newWorld(t, Config{})
	max = nfConntrackMax(t, w.hns)
	h, err := Open(Config{HostNetns: w.hostP, ConnLimit: uint32(max / 4)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	d = mustDests(t, worldIP+"/32:8080")
	for slot := 1; slot <= 2; slot++ {
		r, err := h.Allow(slot, d)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		if slot == 1 {
			r1 = r
		}
	}
	return h, d, max, r1
}

// The runs' connection limits together stay within half the host's
// conntrack table: with a limit of a quarter of it, a third run is
// refused until one of the two closes. A policy replaced in its slot
// holds no more.
func TestConntrackShare(t *testing.T) {
	h, d, max, r1 := quarterShares(t)
	if _, err := h.Allow(2, d); err != nil {
		t.Fatalf("slot 2's policy replaced: %v", err)
	}
	if r, err := h.Allow(3, d); !errors.Is(err, ErrFull) {
		if err == nil {
			r.Close()
		}
		t.Fatalf("a third run of %d connections on a table of %d: %v, want ErrFull", max/4, max, err)
	}
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	r3, err := h.Allow(3, d)
	if err != nil {
		t.Fatalf("a third run once the first closed: %v", err)
	}
	r3.Close()
}

// A run whose policy Attach installs again (its chain gone, as after a
// host restart) is held to the same share as a new one: with two
// policies of a quarter of the table in place, it is refused ErrFull
// and nothing of its link is left.
func TestConntrackShareOnAttach(t *testing.T) {
	h, d, _, r1 := quarterShares(t)
	if err := h.Reconcile(func(slot int) bool { return slot != 1 }); err != nil {
		t.Fatal(err)
	}
	r3, err := h.Allow(3, d)
	if err != nil {
		t.Fatalf("a run in the place of the policy removed: %v", err)
	}
	defer r3.Close()
	_, path := newNetns(t)
	if err := r1.Attach(path); !errors.Is(err, ErrFull) {
		t.Fatalf("run 1 attached again with its policy gone and two others in place: %v, want ErrFull", err)
	}
	if _, err := h.nl.LinkByName(r1.Link()); err == nil {
		t.Fatalf("link %s left after a refused Attach", r1.Link())
	}
	if err := r3.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r1.Attach(path); err != nil {
		t.Fatalf("run 1 attached once the third closed: %v", err)
	}
}

func mustDests(t *testing.T, dests ...string) []unit.Dest {
	t.Helper()
	var ds []unit.Dest
	for _, s := range dests {
		d, err := unit.ParseDest(s)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	unit.SortDests(ds)
	return ds
}

// A unit's queries to the runs' resolver are not tracked: sent from as
// many ports as it likes, they would fill the host's conntrack table
// past its run's connection limit, which counts only its flows out. The
// resolver still answers.
func TestDNSUntracked(t *testing.T) {
	w := newWorld(t, Config{})
	r1, s1 := w.sandbox(1, "world.example:8080")
	srv, err := w.host.ServeDNS(DNSConfig{
		Resolver: &Resolver{Upstream: w.host.Upstream(netip.MustParseAddrPort(worldIP + ":53"))},
		Run: func(slot int) *Run {
			if slot == 1 {
				return r1
			}
			return nil
		},
		Resolved: func(int, Resolution) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	reply := ask(t, s1, query(t, 78, "other.example.", dnsmessage.TypeA))
	if reply == nil {
		t.Fatal("the resolver did not answer")
	}
	if rcode, _, _ := readReply(t, reply, 78); rcode != dnsmessage.RCodeRefused {
		t.Fatalf("a name not granted: %s, want REFUSED", rcode)
	}
	const queries = 50
	for i := range queries {
		if err := sendUDP(s1, netip.AddrPortFrom(GatewayAddr, DNSPort).String(), fmt.Sprintf("query %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	flows, err := w.host.nl.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Forward.DstIP.Equal(net.IP(GatewayAddr.AsSlice())) && f.Forward.DstPort == DNSPort {
			n++
		}
	}
	if n > 0 {
		t.Fatalf("%d of the unit's queries to the resolver are tracked", n)
	}
}
