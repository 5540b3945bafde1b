package egress

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
)

// ask sends q from namespace ns to the gateway's resolver and returns the
// reply, or nil after a second without one.
func ask(t *testing.T, ns netns.NsHandle, q []byte) []byte {
	t.Helper()
	var reply []byte
	err := inNetns(ns, func() error {
		c, err := net.Dial("udp4", netip.AddrPortFrom(GatewayAddr, DNSPort).String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write(q); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err == nil {
			reply = buf[:n]
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return reply
}

// The runs' resolver, in the host's namespace, forwarding to a resolver
// in the world: each run is answered for its own grant's names, and
// what it is answered it may reach.
func TestDNSServer(t *testing.T) {
	w := newWorld(t, Config{})
	serve(t, w.wns, worldIP+":8080")
	world := netip.MustParseAddr(worldIP)
	// The world's resolver: world.example is the world.
	var upc net.PacketConn
	if err := inNetns(w.wns, func() (err error) { upc, err = net.ListenPacket("udp4", worldIP+":53"); return err }); err != nil {
		t.Fatal(err)
	}
	defer upc.Close()
	up := answering(t, nil, rr{name: "world.example.", a: world, ttl: 30})
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := upc.ReadFrom(buf)
			if err != nil {
				return
			}
			if b, err := up(buf[:n]); err == nil {
				upc.WriteTo(b, from)
			}
		}
	}()
	r1, s1 := w.sandbox(1, "world.example:8080")
	r2, s2 := w.sandbox(2, "other.example:8080")
	runs := map[int]*Run{1: r1, 2: r2}
	var mu sync.Mutex
	var journal []string
	srv, err := w.host.ServeDNS(DNSConfig{
		Resolver: &Resolver{Upstream: w.host.Upstream(netip.AddrPortFrom(world, 53)), Ceiling: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
		Run:      func(slot int) *Run { return runs[slot] },
		Resolved: func(slot int, res Resolution) error {
			mu.Lock()
			defer mu.Unlock()
			journal = append(journal, res.Name)
			if slot != 1 || !slices.Equal(res.Addrs, []netip.Addr{world}) || res.TTL != 30*time.Second {
				t.Errorf("journaled slot %d %+v", slot, res)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	if c, _, err := dial(s1, "", worldIP+":8080"); err == nil {
		c.Close()
		t.Fatal("reached before resolving")
	}
	reply := ask(t, s1, query(t, 77, "world.example.", dnsmessage.TypeA))
	if reply == nil {
		t.Fatal("no answer from the gateway's resolver")
	}
	if rcode, addrs, _ := readReply(t, reply, 77); rcode != dnsmessage.RCodeSuccess || !slices.Equal(addrs, []netip.Addr{world}) {
		t.Fatalf("answered %s %v", rcode, addrs)
	}
	c, _, err := dial(s1, "", worldIP+":8080")
	if err != nil {
		t.Fatalf("resolved, then: %v", err)
	}
	c.Close()
	for _, tc := range []struct {
		what string
		ns   netns.NsHandle
		name string
	}{
		{"a name the run was not granted", s1, "other.example."},
		{"another run's name", s2, "world.example."},
	} {
		reply := ask(t, tc.ns, query(t, 78, tc.name, dnsmessage.TypeA))
		if reply == nil {
			t.Errorf("%s: no answer", tc.what)
			continue
		}
		if rcode, addrs, _ := readReply(t, reply, 78); rcode != dnsmessage.RCodeRefused || len(addrs) != 0 {
			t.Errorf("%s: %s %v, want REFUSED", tc.what, rcode, addrs)
		}
	}
	if c, _, err := dial(s2, "", worldIP+":8080"); err == nil {
		c.Close()
		t.Error("run 2 reached the address run 1 resolved")
	}
	// The resolver's port is all a sandbox reaches of the host.
	if c, _, err := dial(s1, "", GatewayAddr.String()+":53"); err == nil {
		c.Close()
		t.Error("TCP to the gateway reached the host")
	}
	mu.Lock()
	if !slices.Equal(journal, []string{"world.example"}) {
		t.Errorf("journaled %v, want the one resolution", journal)
	}
	mu.Unlock()

	// Closed, the resolver's port is shut again: a listener of the
	// host's own on port 53 (any address) is out of the sandboxes' reach.
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	var own net.PacketConn
	if err := inNetns(w.hns, func() (err error) { own, err = net.ListenPacket("udp4", "0.0.0.0:53"); return err }); err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := own.ReadFrom(buf)
			if err != nil {
				return
			}
			own.WriteTo(buf[:n], from)
		}
	}()
	if reply := ask(t, s1, query(t, 79, "world.example.", dnsmessage.TypeA)); reply != nil {
		t.Errorf("the host's own port 53 answered a sandbox after the resolver closed: %x", reply)
	}
}
