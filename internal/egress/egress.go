// Package egress links a sandbox to the host and lets out what its egress
// grant allows, nothing else (docs/unit.md, the egress block).
//
// # The link
//
// A run holds a slot, a number the caller gives (1 up to the size of the
// pool less two). Its link is a veth pair: rrdeN on the host, eth0 in the
// sandbox's network namespace. Every sandbox sees the same addresses,
// [SandboxAddr]/30 with the gateway [GatewayAddr], on every host, so a
// parked unit's own view of the network is the same after a resume or a
// migration. On the host each run has an address of its own in the pool
// (10.254.0.0/16 unless configured; slot N is the pool's address N): the
// ingress of rrdeN rewrites the sandbox's source to it and the egress of
// rrdeN rewrites it back, statelessly, so the host's connection tracking,
// routing and address translation see runs apart. Two runs with the same
// flow from their sandboxes are two flows on the host.
//
// # The policy
//
// Per run, in nftables set up over netlink (the rules in rules.go):
//   - from the sandbox, only IPv4 and ARP from [SandboxAddr]: a forged
//     source or IPv6 is dropped at the link;
//   - never the host's own addresses (nothing from a sandbox is delivered
//     locally but its queries to the runs' resolver, untracked), 0/8,
//     127/8, 169.254/16 and the other clouds' metadata addresses,
//     multicast, 240/4, the sandbox /30 or the pool (other sandboxes);
//   - new flows only to an allowed prefix, protocol and port range, and at
//     most Config.ConnLimit of them tracked at once (4096 by default),
//     the runs' limits together at most half the host's conntrack table;
//   - into the sandbox, replies only, from the world and from the host;
//   - out, the host's address on the way out (masquerade).
//
// The forward chain's accepts count what they let through each way
// ([Counters]): the chain lives from Allow to Close, parks between, so a
// run's counters go on across its parks here and a daemon's restarts.
//
// Deny is the default. A destination given by name allows the
// addresses of its set, which the daemon's resolver fills from the
// answers it gave the run ([Run.Allowed], dns.go), each until its TTL.
//
// # Lifetime
//
// [Gateway.Allow] installs a run's policy, [Run.Attach] makes its link into a
// sandbox's namespace, [Run.Detach] removes the link and keeps the policy
// and the run's tracked connections (a park: the outside's packets for the
// run are dropped, not rejected, until a new link or the close), and
// [Run.Close] removes all of it. [Gateway.Reconcile] removes every link,
// chain and tracked connection of a slot no run owns: what a crash left.
//
// A restore ([Run.Restore]) holds the outside's packets from its link
// until [Run.Pass]. Where the host holds no state of the run's
// connections (restored on another host; its rules gone; its tracked
// connections removed by [Gateway.Forget] when a park outlived its
// hold), Pass first aborts the sandbox's TCP connections to outside
// (sockets.go), so the unit sees an error rather than a silent peer;
// [Run.ToClose] lists them before, for the caller to journal. A held
// link says so, and why, in its rules ([Gateway.Held]): a process that
// adopts the run after a restart passes it ([Run.Reheld]).
//
// A conntrack zone per run is not used: the per-run address already keeps
// runs apart in the one zone, and a zone set for both directions would
// leave the replies arriving on the host's uplink unmatched (they carry
// no sign of their run before their lookup); a zone for the original
// direction only is not expressible through the nftables library used.
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

var (
	// SandboxAddr is every sandbox's address, on its eth0 (a /30).
	SandboxAddr = netip.MustParseAddr("10.255.255.2")
	// GatewayAddr is every sandbox's gateway: the host's side of its link.
	GatewayAddr = netip.MustParseAddr("10.255.255.1")
)

// DefaultPool holds the runs' addresses on the host.
var DefaultPool = netip.MustParsePrefix("10.254.0.0/16")

// DefaultConnLimit bounds the connections a run has tracked at once.
const DefaultConnLimit = 4096

// DefaultLinkPrefix begins the host side's name of every run's link.
const DefaultLinkPrefix = "rrde"

// sandboxLink is the name of the sandbox's side of its link.
const sandboxLink = "eth0"

var (
	// ErrInvalid is a slot, policy or configuration this package refuses.
	ErrInvalid = errors.New("egress: invalid")
	// ErrClosed is a run closed already.
	ErrClosed = errors.New("egress: run closed")
	// ErrFull is a new run refused for the host's capacity: the runs'
	// connection limits would hold more than their share of its
	// conntrack table ([Gateway.Allow]), or every slot is held.
	ErrFull = errors.New("egress: the host takes no more egress runs now")
)

// Config is a host's egress set-up.
type Config struct {
	// HostNetns is the path of the network namespace the links' host
	// sides live in; "" is the caller's own.
	HostNetns string
	// Pool holds the runs' addresses on the host (a /16 to a /30);
	// DefaultPool when zero.
	Pool netip.Prefix
	// ConnLimit bounds a run's tracked connections; DefaultConnLimit
	// when zero.
	ConnLimit uint32
	// LinkPrefix begins the host side's name of each run's link (1 to 10
	// of a-z); DefaultLinkPrefix when empty. It names the host's tables
	// too: runrecordd_egress, or runrecordd_egress_PREFIX with another.
	// Two Gateways in one namespace need pools and prefixes apart, no
	// prefix the beginning of another.
	LinkPrefix string
}

// Gateway links runs' sandboxes out of one host network namespace.
type Gateway struct {
	prefix    string // Config.LinkPrefix
	table     string // the host's tables' name (rules.go)
	pool      netip.Prefix
	connLimit uint32
	ns        netns.NsHandle
	nl        *netlink.Handle
	mu        sync.Mutex // one change of links and rules at a time
	resolving bool       // a DNSServer serves (guarded by mu)
	// nc is the nftables connection, kept open between changes (nft);
	// nil until the first. Guarded by mu once Open returned.
	nc *nftables.Conn
}

// Open sets the host's namespace up for egress: IPv4 forwarding on, the
// shared tables and chains, and a blackhole route for the pool (a parked
// run's packets are dropped rather than routed elsewhere).
func Open(cfg Config) (*Gateway, error) {
	h := &Gateway{pool: cfg.Pool, connLimit: cfg.ConnLimit, prefix: cfg.LinkPrefix, table: tableName}
	if !h.pool.IsValid() {
		h.pool = DefaultPool
	}
	if h.prefix == "" {
		h.prefix = DefaultLinkPrefix
	}
	if len(h.prefix) > 10 || strings.Trim(h.prefix, "abcdefghijklmnopqrstuvwxyz") != "" {
		return nil, fmt.Errorf("%w: link prefix %q: want 1 to 10 of a-z", ErrInvalid, h.prefix)
	}
	if h.prefix != DefaultLinkPrefix {
		h.table += "_" + h.prefix
	}
	if h.connLimit == 0 {
		h.connLimit = DefaultConnLimit
	}
	if !h.pool.Addr().Is4() || h.pool.Bits() < 16 || h.pool.Bits() > 30 || h.pool.Masked() != h.pool {
		return nil, fmt.Errorf("%w: pool %s: want an IPv4 network from /16 to /30", ErrInvalid, h.pool)
	}
	var err error
	if cfg.HostNetns == "" {
		h.ns, err = threadNetns()
	} else {
		h.ns, err = netns.GetFromPath(cfg.HostNetns)
	}
	if err != nil {
		return nil, fmt.Errorf("host network namespace: %w", err)
	}
	if h.nl, err = netlink.NewHandleAt(h.ns); err != nil {
		h.ns.Close()
		return nil, fmt.Errorf("netlink in the host network namespace: %w", err)
	}
	if err := h.setUp(); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

func (h *Gateway) setUp() error {
	if err := inNetns(h.ns, func() error { return sysctl("net/ipv4/ip_forward", "1") }); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	err := h.nl.RouteReplace(&netlink.Route{
		Dst: prefixNet(h.pool), Type: unix.RTN_BLACKHOLE, Family: netlink.FAMILY_V4, Priority: 4294967295,
	})
	if err != nil {
		return fmt.Errorf("blackhole route for %s: %w", h.pool, err)
	}
	return h.nft(func(c *nftables.Conn) error { h.hostTables(c); return nil })
}

// Close releases the host's handles. Links and rules stay: runs own them.
func (h *Gateway) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.nc != nil {
		h.nc.CloseLasting()
		h.nc = nil
	}
	if h.nl != nil {
		h.nl.Close()
	}
	return h.ns.Close()
}

// nft runs f on a connection to the host namespace's nftables and commits
// what f queued as one transaction. The connection stays open for the
// next (h.nc): the kernel answers the close of a netfilter socket after
// a commit only once the commit's objects are freed, a grace period of
// RCU, 5 to 15 ms on a loaded host (docs/benchmarks.md, "Egress"). After
// an error it is closed: what f queued, or a reply left unread, never
// reaches the next transaction.
func (h *Gateway) nft(f func(c *nftables.Conn) error) (retErr error) {
	if h.nc == nil {
		c, err := nftables.New(nftables.WithNetNSFd(int(h.ns)), nftables.AsLasting())
		if err != nil {
			return fmt.Errorf("nftables: %w", err)
		}
		h.nc = c
	}
	defer func() {
		if retErr != nil {
			h.nc.CloseLasting()
			h.nc = nil
		}
	}()
	if err := f(h.nc); err != nil {
		return err
	}
	if err := h.nc.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}

// linkName is the host side's name of run slot's link.
func (h *Gateway) linkName(slot int) string { return h.prefix + strconv.Itoa(slot) }

// slotOf is the slot of a host-side link name, if it is one.
func (h *Gateway) slotOf(name string) (int, bool) {
	n, ok := strings.CutPrefix(name, h.prefix)
	if !ok {
		return 0, false
	}
	slot, err := strconv.Atoi(n)
	return slot, err == nil && strconv.Itoa(slot) == n
}

// addr is run slot's address on the host.
func (h *Gateway) addr(slot int) netip.Addr {
	v := u32(h.pool.Addr()) + uint32(slot)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Slots is how many runs the pool holds: slots 1 to Slots.
func (h *Gateway) Slots() int { return 1<<(32-h.pool.Bits()) - 2 }

// Run is one run's egress on a host. Its methods and the Gateway's may be
// called from any goroutine: changes are made one at a time.
type Run struct {
	h      *Gateway
	slot   int
	rules  []allowRule
	closed bool // guarded by h.mu
	// held: the next Attach holds the outside's packets for the sandbox
	// until Pass (a restore: its sockets are not back yet). Set by
	// Detach and Adopt; guarded by h.mu.
	held bool
	// linked: the last Attach succeeded and no Detach came since
	// (guarded by h.mu).
	linked bool
	// reset: why Pass closes the run's TCP connections to outside
	// before it lets the outside's packets through (Restore); sb is the
	// namespace they are in, from Attach to Pass when there is a reset
	// to do. Guarded by h.mu.
	reset Reset
	sb    *netns.NsHandle
}

// Allow installs the policy of the run holding slot: allow is its grant's
// allow-list (a name's set begins empty). A slot's earlier policy is
// replaced. Nothing leaves until [Run.Attach].
//
// The runs' connection limits together stay within [ConntrackShare] of
// the host's conntrack table (nf_conntrack_max, read at each Allow): a
// run whose limit does not fit beside those of the policies installed
// (parked runs' among them: they keep their tracked connections) is
// refused with ErrFull, so no set of runs fills the table the host's own
// flows need.
func (h *Gateway) Allow(slot int, allow []unit.Dest) (*Run, error) {
	if slot < 1 || slot > h.Slots() {
		return nil, fmt.Errorf("%w: slot %d: want 1 to %d", ErrInvalid, slot, h.Slots())
	}
	if len(allow) == 0 || len(allow) > unit.MaxEgressDests {
		return nil, fmt.Errorf("%w: an allow-list of %d destinations", ErrInvalid, len(allow))
	}
	rules, err := allowRules(allow)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	err = h.nft(func(c *nftables.Conn) error {
		if err := h.fits(c, slot); err != nil {
			return err
		}
		h.addRun(c, slot, rules)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("slot %d: %w", slot, err)
	}
	return &Run{h: h, slot: slot, rules: rules}, nil
}

// ConntrackShare is the part of the host's conntrack table the runs'
// connection limits may hold together: a half.
const ConntrackShare = 2 // the table's size divided by this

// fits says whether run slot's connection limit fits beside those of the
// other slots with a policy: ErrFull if not.
func (h *Gateway) fits(c *nftables.Conn, slot int) error {
	byslot, err := h.runChains(c)
	if err != nil {
		return err
	}
	policies := 1
	for s, chs := range byslot {
		if s != slot && slices.ContainsFunc(chs, func(ch *nftables.Chain) bool { return ch.Name == fwdChain+strconv.Itoa(s) }) {
			policies++
		}
	}
	var size uint64
	err = inNetns(h.ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_max")
		if err == nil {
			size, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("the host's conntrack table size: %w", err)
	}
	if uint64(policies)*uint64(h.connLimit) > size/ConntrackShare {
		return fmt.Errorf("%w: %d runs of %d connections each would hold more than half of the conntrack table (nf_conntrack_max %d)", ErrFull, policies, h.connLimit, size)
	}
	return nil
}

// Adopt is the run holding slot, whose policy allow a Gateway installed
// before (this process's, or a daemon's before it restarted): nothing is
// installed now. Its [Run.Attach] installs the policy again if its chain
// is gone (the host restarted); its [Run.Close] removes what there is.
func (h *Gateway) Adopt(slot int, allow []unit.Dest) (*Run, error) {
	if slot < 1 || slot > h.Slots() {
		return nil, fmt.Errorf("%w: slot %d: want 1 to %d", ErrInvalid, slot, h.Slots())
	}
	rules, err := allowRules(allow)
	if err != nil {
		return nil, err
	}
	return &Run{h: h, slot: slot, rules: rules, held: true}, nil
}

// Restore readies the run for a restore: its next Attach holds the
// outside's packets until Pass, and Pass first closes the sandbox's TCP
// connections to outside unless why is Keep (sockets.go). An Attach that
// finds the run's rules gone (the host restarted since its park) makes
// Keep Elsewhere: the host holds no state of its connections.
func (r *Run) Restore(why Reset) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.held, r.reset = true, why
}

// dropSandbox closes the sandbox namespace the run kept for Pass.
func (r *Run) dropSandbox() {
	if r.sb != nil {
		r.sb.Close()
		r.sb = nil
	}
}

// Slot is the run's slot.
func (r *Run) Slot() int { return r.slot }

// Link is the host side's name of the run's link.
func (r *Run) Link() string { return r.h.linkName(r.slot) }

// Addr is the run's address on the host.
func (r *Run) Addr() netip.Addr { return r.h.addr(r.slot) }

// Attach links the sandbox whose network namespace is at path (a pin, or
// /proc/PID/ns/net) to the host: eth0 there with [SandboxAddr]/30 and a
// default route through [GatewayAddr], rrdeN here. A link the run had is
// removed first (a namespace being torn down may still hold it). On error
// nothing of the link is left. A closed run is refused (ErrClosed).
//
// The run's policy is installed again with the link's chains, in one
// transaction, before the link is up: a link never carries traffic
// without its run's rules, even if they were removed since Allow. Installed
// again, it is held to Allow's conntrack share (ErrFull).
func (r *Run) Attach(path string) (retErr error) {
	h, name := r.h, r.Link()
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.closed {
		return fmt.Errorf("slot %d: %w", r.slot, ErrClosed)
	}
	sb, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("sandbox network namespace: %w", err)
	}
	kept := false
	defer func() {
		if !kept {
			sb.Close()
		}
	}()
	r.dropSandbox()
	if err := h.unlink(r.slot); err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, h.unlink(r.slot))
		}
	}()
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := h.nl.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: sandboxLink, PeerNamespace: netlink.NsFd(int(sb))}); err != nil {
		return fmt.Errorf("add link %s: %w", name, err)
	}
	host, err := h.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	// No IPv6; ARP answers only for the link's own address, not every
	// address of the host.
	err = inNetns(h.ns, func() error {
		return errors.Join(sysctl("net/ipv6/conf/"+name+"/disable_ipv6", "1"), sysctl("net/ipv4/conf/"+name+"/arp_ignore", "1"))
	})
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := h.nl.AddrAdd(host, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(GatewayAddr, 32))}); err != nil {
		return fmt.Errorf("link %s: address: %w", name, err)
	}
	// The ingress and egress chains hook the link's device: added once
	// it exists, before it is up.
	err = h.nft(func(c *nftables.Conn) error {
		byslot, err := h.runChains(c)
		if err != nil {
			return err
		}
		// A chain in place keeps its connection count: replaced, it
		// would start again from zero with the run's flows still there.
		if !slices.ContainsFunc(byslot[r.slot], func(ch *nftables.Chain) bool { return ch.Name == fwdChain+strconv.Itoa(r.slot) }) {
			if err := h.fits(c, r.slot); err != nil {
				return err
			}
			h.addRun(c, r.slot, r.rules)
			if r.held && r.reset == Keep {
				r.reset = Elsewhere
			}
		}
		h.addLinkChains(c, r.slot, r.held, r.reset)
		return nil
	})
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := h.nl.LinkSetUp(host); err != nil {
		return fmt.Errorf("link %s up: %w", name, err)
	}
	err = h.nl.RouteReplace(&netlink.Route{
		LinkIndex: host.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(r.Addr(), 32)),
		Gw: net.IP(SandboxAddr.AsSlice()), Flags: int(netlink.FLAG_ONLINK),
	})
	if err != nil {
		return fmt.Errorf("route to %s: %w", r.Addr(), err)
	}
	if err := r.sandboxSide(sb); err != nil {
		return err
	}
	r.linked = true
	if r.held && r.reset != Keep {
		r.sb, kept = &sb, true
	}
	return nil
}

// sandboxSide sets up the sandbox's side of the link.
func (r *Run) sandboxSide(sb netns.NsHandle) error {
	nl, err := netlink.NewHandleAt(sb)
	if err != nil {
		return fmt.Errorf("netlink in the sandbox: %w", err)
	}
	defer nl.Close()
	l, err := nl.LinkByName(sandboxLink)
	if err != nil {
		return fmt.Errorf("sandbox link: %w", err)
	}
	// No IPv6; ARP from the sandbox's address on the link, whatever
	// source the packet that needs it has (the link takes ARP from that
	// address only).
	err = inNetns(sb, func() error {
		return errors.Join(sysctl("net/ipv6/conf/"+sandboxLink+"/disable_ipv6", "1"), sysctl("net/ipv4/conf/"+sandboxLink+"/arp_announce", "2"))
	})
	if err != nil {
		return fmt.Errorf("sandbox link: %w", err)
	}
	if err := nl.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(SandboxAddr, 30))}); err != nil {
		return fmt.Errorf("sandbox address: %w", err)
	}
	if err := nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("sandbox link up: %w", err)
	}
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(GatewayAddr.AsSlice())}); err != nil {
		return fmt.Errorf("sandbox default route: %w", err)
	}
	return errors.Join(waitActive(r.h.nl, r.Link()), waitActive(nl, sandboxLink))
}

// waitActive waits until the link name sends: the side that was up
// before its peer drops what it is given (its queueing discipline is
// "noop") until the kernel's link watch has seen the carrier, a moment
// later. A unit's first ARP reply lost there costs it a second.
func waitActive(nl *netlink.Handle, name string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		l, err := nl.LinkByName(name)
		if err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
		qs, err := nl.QdiscList(l)
		if err != nil {
			return fmt.Errorf("link %s: queueing disciplines: %w", name, err)
		}
		noop := len(qs) == 0
		for _, q := range qs {
			noop = noop || q.Type() == "noop"
		}
		if l.Attrs().OperState == netlink.OperUp && !noop {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link %s: not sending after 2 s (state %s)", name, l.Attrs().OperState)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// Detach removes the run's link and its chains, keeping its policy and
// its tracked connections: the outside's packets for the run are dropped
// until the run has a link again. A run without a link is not an error.
func (r *Run) Detach() error {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.held, r.linked = true, false
	r.dropSandbox()
	return r.h.unlink(r.slot)
}

// ToClose is what the next Pass closes: why, and the run's TCP
// connections to outside now (sockets.go); Closed{} when it closes none.
// While the run is held no connection to outside is established (the
// outside's packets are dropped), so Pass closes these, less any that
// closed meanwhile: a caller journals them before the Pass.
func (r *Run) ToClose() (Closed, error) {
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if !r.held || r.closed || !r.linked || r.reset == Keep || r.sb == nil {
		return Closed{}, nil
	}
	conns, err := listOutside(*r.sb)
	if err != nil {
		return Closed{}, fmt.Errorf("slot %d: connections to outside: %w", r.slot, err)
	}
	return Closed{Why: r.reset, Conns: conns}, nil
}

// Reheld readies the run, adopted by a process restarted while its
// sandbox (network namespace at path) was linked and held (Held), for
// the Pass the last process did not make: Pass closes the sandbox's TCP
// connections to outside unless why is Keep, then lets the outside's
// packets through.
func (r *Run) Reheld(path string, why Reset) error {
	sb, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("sandbox network namespace: %w", err)
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.dropSandbox()
	r.held, r.linked, r.reset = true, true, why
	if why == Keep {
		sb.Close()
	} else {
		r.sb = &sb
	}
	return nil
}

// Pass lets the outside's packets through to the run's sandbox again
// once its restore has put its sockets back. An Attach after a Detach
// (or of an adopted or restored run) holds them: a runc restore links
// the sandbox out when CRIU sets its namespaces up, before any socket is
// restored, and a segment arriving there would be answered with a
// reset. A run not held, or without a link, is left as it is.
//
// A run restored with a reset to do (Restore) has its TCP connections to
// outside closed first, while held: their replies cannot reach it on
// this host. Closed says which. Connections not all closed are an
// error, and the packets pass all the same: the unit goes on.
func (r *Run) Pass() (Closed, error) {
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if !r.held || r.closed || !r.linked {
		return Closed{}, nil
	}
	var out Closed
	var rerr error
	if r.reset != Keep && r.sb != nil {
		out.Why = r.reset
		out.Conns, rerr = resetOutside(*r.sb)
		if rerr != nil {
			rerr = fmt.Errorf("slot %d: close connections to outside: %w", r.slot, rerr)
		}
	}
	err := h.nft(func(c *nftables.Conn) error {
		h.addLinkChains(c, r.slot, false, Keep)
		return nil
	})
	if err != nil {
		return out, errors.Join(rerr, fmt.Errorf("slot %d: pass: %w", r.slot, err))
	}
	r.held, r.reset = false, Keep
	r.dropSandbox()
	return out, rerr
}

func (h *Gateway) unlink(slot int) error {
	err := h.nft(func(c *nftables.Conn) error {
		byslot, err := h.runChains(c)
		if err != nil {
			return err
		}
		for _, ch := range byslot[slot] {
			if ch.Table.Family == nftables.TableFamilyNetdev {
				c.FlushChain(ch)
				c.DelChain(ch)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("slot %d: %w", slot, err)
	}
	l, err := h.nl.LinkByName(h.linkName(slot))
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("link %s: %w", h.linkName(slot), err)
	}
	// Deleting one end of a veth pair deletes both.
	if err := h.nl.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", h.linkName(slot), err)
	}
	return nil
}

// Counters is what a run's forward chain let through since its policy
// was installed: IPv4 packets and their bytes (IP headers included, no
// link-layer header), out of the sandbox and into it. A packet its
// policy drops is not counted.
type Counters struct {
	InBytes, InPackets, OutBytes, OutPackets uint64
}

// Counters reads run slot's counters from the kernel, over netlink.
// false: the slot has no policy installed (none was, it was closed, or
// the host restarted since).
func (h *Gateway) Counters(slot int) (Counters, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out Counters
	var found bool
	err := h.nft(func(c *nftables.Conn) error {
		byslot, err := h.runChains(c)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(byslot[slot], func(ch *nftables.Chain) bool { return ch.Name == fwdChain+strconv.Itoa(slot) })
		if i < 0 {
			return nil
		}
		ch := byslot[slot][i]
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return fmt.Errorf("rules of %s: %w", ch.Name, err)
		}
		found = true
		for _, r := range rules {
			for _, e := range r.Exprs {
				n, ok := e.(*expr.Counter)
				switch {
				case !ok:
				case slices.Equal(r.UserData, counterOut):
					out.OutBytes += n.Bytes
					out.OutPackets += n.Packets
				case slices.Equal(r.UserData, counterIn):
					out.InBytes += n.Bytes
					out.InPackets += n.Packets
				}
			}
		}
		return nil
	})
	if err != nil {
		return Counters{}, false, fmt.Errorf("slot %d: counters: %w", slot, err)
	}
	return out, found, nil
}

// Counters reads the run's counters ([Gateway.Counters]).
func (r *Run) Counters() (Counters, bool, error) { return r.h.Counters(r.slot) }

// Close removes everything of the run: its link, its chains and its
// tracked connections.
func (r *Run) Close() error {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.closed = true
	r.dropSandbox()
	return r.h.remove(r.slot)
}

// Forget removes run slot's tracked connections, and with them their
// address translation: a park held them as long as the host keeps them
// (the caller's deadline). Its rules stay. The outside's packets for
// those connections then meet the host with no connection of theirs:
// the host's stack answers them with a reset.
func (h *Gateway) Forget(slot int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.nl.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, flowsOf(func(s int) bool { return s == slot }, h))
	if err != nil {
		return fmt.Errorf("slot %d: tracked connections: %w", slot, err)
	}
	return nil
}

func (h *Gateway) remove(slot int) error {
	err := h.unlink(slot)
	err = errors.Join(err, h.nft(func(c *nftables.Conn) error {
		byslot, err := h.runChains(c)
		if err != nil {
			return err
		}
		for _, ch := range byslot[slot] {
			c.FlushChain(ch)
			c.DelChain(ch)
		}
		return h.delNameSets(c, slot)
	}))
	_, cerr := h.nl.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, flowsOf(func(s int) bool { return s == slot }, h))
	if cerr != nil {
		err = errors.Join(err, fmt.Errorf("slot %d: tracked connections: %w", slot, cerr))
	}
	return err
}

// flowFilter matches the tracked connections of the slots some says.
type flowFilter struct {
	h    *Gateway
	some func(slot int) bool
}

func flowsOf(some func(int) bool, h *Gateway) flowFilter { return flowFilter{h: h, some: some} }

func (f flowFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	a, ok := netip.AddrFromSlice(fl.Forward.SrcIP)
	if !ok || !f.h.pool.Contains(a.Unmap()) {
		return false
	}
	return f.some(int(u32(a.Unmap()) - u32(f.h.pool.Addr())))
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// Reconcile removes every link, chain and tracked connection of a slot
// owned says no run holds: what a crash left. It is for the daemon's
// start, before runs are attached.
func (h *Gateway) Reconcile(owned func(slot int) bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	links, err := h.nl.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	stale := map[int]bool{}
	for _, l := range links {
		if slot, ok := h.slotOf(l.Attrs().Name); ok && !owned(slot) {
			stale[slot] = true
		}
	}
	err = h.nft(func(c *nftables.Conn) error {
		byslot, err := h.runChains(c)
		for slot := range byslot {
			if !owned(slot) {
				stale[slot] = true
			}
		}
		withSets, serr := h.setSlots(c)
		for _, slot := range withSets {
			if !owned(slot) {
				stale[slot] = true
			}
		}
		return errors.Join(err, serr)
	})
	errs = append(errs, err)
	for slot := range stale {
		errs = append(errs, h.remove(slot))
	}
	_, err = h.nl.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, flowsOf(func(s int) bool { return !owned(s) }, h))
	errs = append(errs, err)
	return errors.Join(errs...)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), 32)}
}

// sysctl writes a value under /proc/sys of the calling thread's network
// namespace.
func sysctl(name, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", name), []byte(value+"\n"), 0)
}

// threadNetns is the calling thread's network namespace.
func threadNetns() (netns.NsHandle, error) {
	return netns.GetFromPath("/proc/thread-self/ns/net")
}

// inNetns runs f on a thread in namespace ns. If the thread cannot
// return to its namespace it stays locked and dies with its goroutine.
func inNetns(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := threadNetns()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer own.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		err = f()
		if serr := netns.Set(own); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("return to own network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
