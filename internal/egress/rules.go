package egress

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The nftables objects, all in tables named [tableName] (with another
// Config.LinkPrefix P than rrde, tableName_P; rrde below is the prefix):
//
//	table ip runrecordd_egress
//	  chain input       filter, input, accept: iifname "rrde*" drop, but
//	                    UDP to 10.255.255.1 port 53 while the resolver
//	                    serves
//	  chain output      filter, output, accept: oifname "rrde*" drop
//	                    but replies and the resolver's answers (no
//	                    process of the host's opens a flow to a sandbox)
//	  chain untracked-in, untracked-out
//	                    raw, prerouting and output: the resolver's
//	                    queries and answers while it serves: notrack
//	  chain postrouting nat, postrouting: ip saddr POOL masquerade
//	  chain fwd-N       filter, forward, accept: run N's allow-list
//	  set n-N-I         run N's addresses of its Ith destination, a name:
//	                    what the resolver answered, each until its TTL
//	table netdev runrecordd_egress
//	  chain in-N        ingress of rrdeN: source check and rewrite
//	  chain out-N       egress of rrdeN: destination rewrite
//
// Every run's chain is a base chain of its own: removing a run is
// removing its chains, with no rule handle to find in a shared chain. An
// accept ends only the chain it is in; a drop in any chain drops.
const tableName = "runrecordd_egress"

// Chain name prefixes of a run's chains.
const (
	fwdChain = "fwd-"
	inChain  = "in-"
	outChain = "out-"
)

// denied are the destinations no grant reaches, whatever it allows:
// this-network, loopback, link-local (the cloud metadata address of most
// clouds among them), the metadata services outside it (Azure's wire
// server, Alibaba Cloud's), multicast and the reserved block with the
// broadcast address, and the sandbox side's own /30. The host's own
// addresses are local deliveries, refused by the input chain; the pool of
// the runs' addresses (other sandboxes) is added per host.
var denied = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("168.63.129.16/32"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("10.255.255.0/30"),
}

// ifname is an interface name as nftables compares it: NUL-padded.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func metaCmp(key expr.MetaKey, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

// ipField loads the IPv4 source (offset 12) or destination (16).
func ipField(offset uint32) *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}
}

// inPrefix matches the address at offset inside p.
func inPrefix(offset uint32, p netip.Prefix) []expr.Any {
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	a := p.Addr().As4()
	return []expr.Any{
		ipField(offset),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

// rewrite sets the address at offset to a, mending the IP header's
// checksum and the TCP or UDP one (the pseudo-header holds addresses).
func rewrite(offset uint32, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: b[:]},
		&expr.Payload{
			OperationType: expr.PayloadWrite, SourceRegister: 1,
			Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4,
			CsumType: expr.CsumTypeInet, CsumOffset: 10, CsumFlags: unix.NFT_PAYLOAD_L4CSUM_PSEUDOHDR,
		},
	}
}

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, bits), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func verdict(k expr.VerdictKind) *expr.Verdict { return &expr.Verdict{Kind: k} }

func join(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// allowRule is one allowed destination of an egress grant: its prefix
// or its name, protocol and ports. A name's addresses are those the
// resolver gave the run, in the set of the rule (names.go).
type allowRule struct {
	prefix netip.Prefix
	name   string
	proto  byte
	lo, hi uint16
}

// allowRules reads a grant's allow-list.
func allowRules(ds []unit.Dest) ([]allowRule, error) {
	var out []allowRule
	for _, d := range ds {
		var p netip.Prefix
		if d.Name != "" {
			if d.CIDR != "" {
				return nil, fmt.Errorf("%w: destination %s: not a name", ErrInvalid, d)
			}
		} else {
			var err error
			p, err = netip.ParsePrefix(d.CIDR)
			if err != nil || !p.Addr().Is4() || p.Masked() != p {
				return nil, fmt.Errorf("%w: destination %s: not an IPv4 network", ErrInvalid, d)
			}
		}
		var proto byte
		switch d.Proto {
		case "tcp":
			proto = unix.IPPROTO_TCP
		case "udp":
			proto = unix.IPPROTO_UDP
		default:
			return nil, fmt.Errorf("%w: destination %s: protocol %q", ErrInvalid, d, d.Proto)
		}
		a, b, isRange := strings.Cut(d.Ports, "-")
		if !isRange {
			b = a
		}
		lo, err1 := strconv.ParseUint(a, 10, 16)
		hi, err2 := strconv.ParseUint(b, 10, 16)
		if err1 != nil || err2 != nil || lo == 0 || hi < lo {
			return nil, fmt.Errorf("%w: destination %s: ports %q", ErrInvalid, d, d.Ports)
		}
		out = append(out, allowRule{prefix: p, name: d.Name, proto: proto, lo: uint16(lo), hi: uint16(hi)})
	}
	return out, nil
}

// fwdRule is a rule of a run's forward chain; a counted one ends in a
// counter and an accept, and its user data says which way it counts
// ([counterOut], [counterIn]).
type fwdRule struct {
	exprs []expr.Any
	count []byte
}

// The user data of a run's counted rules: what the sandbox sent out, and
// what it was sent.
var (
	counterOut = []byte("runrecordd:out")
	counterIn  = []byte("runrecordd:in")
)

// counted is exprs then a counter and an accept, counting dir.
func counted(dir []byte, exprs ...[]expr.Any) fwdRule {
	return fwdRule{exprs: join(append(exprs, []expr.Any{&expr.Counter{}, verdict(expr.VerdictAccept)})...), count: dir}
}

// forwardRules are run slot's forward chain: what leaves rrdeN, and what
// comes back to it. The accepts count the run's traffic (Counters).
// sets[i] is the set of allow[i] if it is a name (addRun).
func (h *Gateway) forwardRules(link string, addr netip.Addr, allow []allowRule, sets []*nftables.Set) []fwdRule {
	in := metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, ifname(link))
	out := metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpEq, ifname(link))
	var rs []fwdRule
	for _, p := range append(denied[:len(denied):len(denied)], h.pool) {
		rs = append(rs, fwdRule{exprs: join(in, inPrefix(16, p), []expr.Any{verdict(expr.VerdictDrop)})})
	}
	rs = append(rs,
		counted(counterOut, in, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)),
		fwdRule{exprs: join(in, ctState(expr.CtStateBitNEW), []expr.Any{
			&expr.Connlimit{Count: h.connLimit, Flags: expr.NFT_CONNLIMIT_F_INV},
			verdict(expr.VerdictDrop),
		})},
	)
	for i, a := range allow {
		var dst []expr.Any
		if a.name != "" {
			dst = []expr.Any{ipField(16), &expr.Lookup{SourceRegister: 1, SetName: sets[i].Name, SetID: sets[i].ID}}
		} else {
			dst = inPrefix(16, a.prefix)
		}
		rs = append(rs, counted(counterOut, in, dst,
			metaCmp(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{a.proto}),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Range{Op: expr.CmpOpEq, Register: 1,
					FromData: binary.BigEndian.AppendUint16(nil, a.lo), ToData: binary.BigEndian.AppendUint16(nil, a.hi)},
			}))
	}
	a := addr.As4()
	rs = append(rs,
		fwdRule{exprs: join(in, []expr.Any{verdict(expr.VerdictDrop)})},
		// Nothing new goes in: only replies.
		counted(counterIn, out, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)),
		fwdRule{exprs: join(out, []expr.Any{verdict(expr.VerdictDrop)})},
		// The run's flows while it has no link (parked): dropped, not
		// rejected, whatever route they found.
		fwdRule{exprs: join([]expr.Any{ipField(16), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]}},
			metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpNeq, ifname(link)),
			[]expr.Any{verdict(expr.VerdictDrop)})},
	)
	return rs
}

var (
	etherIP  = binary.BigEndian.AppendUint16(nil, unix.ETH_P_IP)
	etherARP = binary.BigEndian.AppendUint16(nil, unix.ETH_P_ARP)
)

// arpIPv4 begins an ARP packet of Ethernet and IPv4 addresses: hardware
// type 1, protocol 0x0800, address lengths 6 and 4. The sender's IPv4
// address is at arpSender.
var arpIPv4 = []byte{0, 1, 0x08, 0, 6, 4}

const arpSender = 14

// ingressRules are rrdeN's ingress (from the sandbox): IPv4 from the
// sandbox's address only, its source rewritten to the run's address;
// ARP of Ethernet and IPv4 from the sandbox's address only (another
// sender address would have the host learn it on the link: as many as a
// unit likes, in the host's neighbour table); nothing else (IPv6 among
// it).
func ingressRules(addr netip.Addr) [][]expr.Any {
	proto := metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpEq, etherIP)
	sb := SandboxAddr.As4()
	return [][]expr.Any{
		join(proto, []expr.Any{ipField(12), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: sb[:]}, verdict(expr.VerdictDrop)}),
		join(proto, rewrite(12, addr), []expr.Any{verdict(expr.VerdictAccept)}),
		join(metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpEq, etherARP), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 0, Len: uint32(len(arpIPv4))},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: arpIPv4},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: arpSender, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: sb[:]},
			verdict(expr.VerdictAccept),
		}),
		{verdict(expr.VerdictDrop)},
	}
}

// egressRules are rrdeN's egress (to the sandbox): IPv4 to the run's
// address, rewritten to the sandbox's; ARP; nothing else.
func egressRules(addr netip.Addr, held bool) [][]expr.Any {
	proto := metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpEq, etherIP)
	a := addr.As4()
	if held {
		return [][]expr.Any{
			join(metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpEq, etherARP), []expr.Any{verdict(expr.VerdictAccept)}),
			{verdict(expr.VerdictDrop)},
		}
	}
	return [][]expr.Any{
		join(proto, []expr.Any{ipField(16), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]}},
			rewrite(16, SandboxAddr), []expr.Any{verdict(expr.VerdictAccept)}),
		join(metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpEq, etherARP), []expr.Any{verdict(expr.VerdictAccept)}),
		{verdict(expr.VerdictDrop)},
	}
}

// resolverFlow matches the runs' DNS over UDP: queries to the
// gateway's port 53 in from a link (toResolver), or its answers out to
// one.
func (h *Gateway) resolverFlow(toResolver bool) []expr.Any {
	link, addr, port := metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpEq, []byte(h.prefix)), uint32(12), uint32(0)
	if toResolver {
		link, addr, port = metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, []byte(h.prefix)), 16, 2
	}
	gw := GatewayAddr.As4()
	return join(link,
		[]expr.Any{ipField(addr), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gw[:]}},
		metaCmp(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{unix.IPPROTO_UDP}),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: port, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, DNSPort)},
		})
}

// hostTables adds the host's tables and shared chains (idempotent: an
// add of what exists is not an error in nftables).
func (h *Gateway) hostTables(c *nftables.Conn) (ip, netdev *nftables.Table) {
	ip = c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: h.table})
	netdev = c.AddTable(&nftables.Table{Family: nftables.TableFamilyNetdev, Name: h.table})
	accept := nftables.ChainPolicyAccept
	chain := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: ip, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
		c.FlushChain(ch)
		return ch
	}
	input := chain("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	output := chain("output", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)
	post := chain("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	rawIn := chain("untracked-in", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw)
	rawOut := chain("untracked-out", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityRaw)
	// The host's own addresses, its listeners among them: nothing from a
	// sandbox is delivered to the host but, while the resolver serves,
	// its queries to it (DNS over UDP to the gateway; the resolver's
	// socket, bound to that address, is the one they reach). They and
	// the answers are not tracked: a unit's run limit counts its flows
	// out, and queries from as many ports as it likes would otherwise
	// hold as many entries of the host's conntrack table.
	if h.resolving {
		c.AddRule(&nftables.Rule{Table: ip, Chain: rawIn, Exprs: join(h.resolverFlow(true), []expr.Any{&expr.Notrack{}})})
		c.AddRule(&nftables.Rule{Table: ip, Chain: rawOut, Exprs: join(h.resolverFlow(false), []expr.Any{&expr.Notrack{}})})
		c.AddRule(&nftables.Rule{Table: ip, Chain: input, Exprs: join(h.resolverFlow(true), []expr.Any{verdict(expr.VerdictAccept)})})
		c.AddRule(&nftables.Rule{Table: ip, Chain: output, Exprs: join(h.resolverFlow(false), []expr.Any{verdict(expr.VerdictAccept)})})
	}
	c.AddRule(&nftables.Rule{Table: ip, Chain: input, Exprs: join(
		metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, []byte(h.prefix)), []expr.Any{verdict(expr.VerdictDrop)})})
	// A sandbox's listeners, from the host: the link's egress rewrites
	// what is sent to the run's address, so a process of the host's
	// would reach them but for this. Replies, and the host's errors
	// about a flow of the sandbox's (a fragmentation needed among them),
	// go.
	toLink := metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpEq, []byte(h.prefix))
	c.AddRule(&nftables.Rule{Table: ip, Chain: output, Exprs: join(toLink,
		ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), []expr.Any{verdict(expr.VerdictAccept)})})
	c.AddRule(&nftables.Rule{Table: ip, Chain: output, Exprs: join(toLink, []expr.Any{verdict(expr.VerdictDrop)})})
	c.AddRule(&nftables.Rule{Table: ip, Chain: post, Exprs: join(inPrefix(12, h.pool), []expr.Any{&expr.Masq{}})})
	return ip, netdev
}

// addRun adds run slot's chains (replacing any of the same names).
func (h *Gateway) addRun(c *nftables.Conn, slot int, allow []allowRule) {
	ip, _ := h.hostTables(c)
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: fwdChain + strconv.Itoa(slot), Table: ip, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.FlushChain(fwd)
	sets := addNameSets(c, ip, slot, allow)
	for _, r := range h.forwardRules(h.linkName(slot), h.addr(slot), allow, sets) {
		c.AddRule(&nftables.Rule{Table: ip, Chain: fwd, Exprs: r.exprs, UserData: r.count})
	}
}

// addLinkChains adds the ingress and egress chains of run slot's link,
// which must exist: held, with why its Pass is to close the run's
// connections to outside in the held rule's tag (Held).
func (h *Gateway) addLinkChains(c *nftables.Conn, slot int, held bool, why Reset) {
	_, nd := h.hostTables(c)
	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriorityRef(-500)
	for _, ch := range []struct {
		name  string
		hook  *nftables.ChainHook
		rules [][]expr.Any
	}{
		{inChain, nftables.ChainHookIngress, ingressRules(h.addr(slot))},
		{outChain, nftables.ChainHookEgress, egressRules(h.addr(slot), held)},
	} {
		chain := c.AddChain(&nftables.Chain{Name: ch.name + strconv.Itoa(slot), Table: nd, Type: nftables.ChainTypeFilter,
			Hooknum: ch.hook, Priority: prio, Policy: &accept, Device: h.linkName(slot)})
		c.FlushChain(chain)
		for i, r := range ch.rules {
			var tag []byte
			if held && ch.name == outChain && i == len(ch.rules)-1 {
				tag = append(slices.Clone(heldTag), byte(why)) // Gateway.Held reads it
			}
			c.AddRule(&nftables.Rule{Table: nd, Chain: chain, Exprs: r, UserData: tag})
		}
	}
}

// heldTag marks the last rule of a held link's egress chain, followed
// by the byte of the Reset its Pass is to do.
var heldTag = []byte("runrecordd:held:")

// Held says whether run slot's link holds the outside's packets (it was
// attached for a restore, or after a park, and not passed since), and
// why its Pass is to close the run's connections to outside, as the
// Attach found it. false without a link.
func (h *Gateway) Held(slot int) (bool, Reset, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	held, why := false, Keep
	err := h.nft(func(c *nftables.Conn) error {
		byslot, err := h.runChains(c)
		if err != nil {
			return err
		}
		for _, ch := range byslot[slot] {
			if ch.Name != outChain+strconv.Itoa(slot) || ch.Table.Family != nftables.TableFamilyNetdev {
				continue
			}
			rules, err := c.GetRules(ch.Table, ch)
			if err != nil {
				return fmt.Errorf("rules of %s: %w", ch.Name, err)
			}
			for _, r := range rules {
				if w, ok := bytes.CutPrefix(r.UserData, heldTag); ok && len(w) == 1 {
					held, why = true, Reset(w[0])
				}
			}
		}
		return nil
	})
	if err != nil {
		return false, Keep, fmt.Errorf("slot %d: %w", slot, err)
	}
	return held, why, nil
}

// runChains lists the chains of runs in the host's tables, by slot.
func (h *Gateway) runChains(c *nftables.Conn) (map[int][]*nftables.Chain, error) {
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("list nftables chains: %w", err)
	}
	out := map[int][]*nftables.Chain{}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != h.table {
			continue
		}
		for _, p := range []string{fwdChain, inChain, outChain} {
			if n, ok := strings.CutPrefix(ch.Name, p); ok {
				if slot, err := strconv.Atoi(n); err == nil {
					out[slot] = append(out[slot], ch)
				}
			}
		}
	}
	return out, nil
}
