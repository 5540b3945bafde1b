package unit

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// egressTag opens the egress block of a grant set's bytes: present exactly
// when the network is [Egress].
const egressTag = 0x02

// MaxEgressDests bounds an egress grant's allow-list.
const MaxEgressDests = 64

// Destination kinds in a grant set's bytes.
const (
	destPrefix = 0x01 // an IPv4 prefix: 4 address bytes, then its length
	destName   = 0x02 // a DNS name: a string
)

// Protocol numbers in a grant set's bytes (IANA's).
var protoNumber = map[string]byte{"tcp": 6, "udp": 17}

// Dest is one destination an egress grant allows: an IPv4 prefix or a DNS
// name (exactly one), a protocol, and a port or port range. Deny is the
// default: a unit reaches only what some Dest allows.
type Dest struct {
	CIDR  string `json:"cidr,omitempty"` // "203.0.113.0/24": the masked network, IPv4 only
	Name  string `json:"name,omitempty"` // "pypi.org": lower case, no trailing dot, two labels at least
	Proto string `json:"proto"`          // "tcp" or "udp"
	Ports string `json:"ports"`          // "443" or "80-443", from 1 to 65535
}

// ParseDest reads a destination written HOST:PORTS[/PROTO], where HOST is
// an IPv4 prefix or a DNS name and PROTO is tcp (the default) or udp:
// "203.0.113.0/24:443", "pypi.org:80-443", "10.0.0.0/8:53/udp".
func ParseDest(s string) (Dest, error) {
	var d Dest
	host, rest, ok := strings.Cut(s, ":")
	if !ok || strings.Contains(rest, ":") {
		return d, fmt.Errorf("%w: egress destination %q: want HOST:PORTS[/PROTO]", ErrInvalid, s)
	}
	ports, proto, ok := strings.Cut(rest, "/")
	if !ok {
		proto = "tcp"
	}
	d.Proto, d.Ports = proto, ports
	if strings.Contains(host, "/") {
		d.CIDR = host
	} else {
		d.Name = host
	}
	if _, err := d.encode(nil); err != nil {
		return Dest{}, err
	}
	return d, nil
}

func (d Dest) String() string {
	host := d.CIDR
	if host == "" {
		host = d.Name
	}
	return host + ":" + d.Ports + "/" + d.Proto
}

// encode appends the destination's bytes to b, or says why it is not one
// an egress grant may hold.
func (d Dest) encode(b []byte) ([]byte, error) {
	bad := func(format string, args ...any) ([]byte, error) {
		return nil, fmt.Errorf("%w: egress destination %s: %s", ErrInvalid, d, fmt.Sprintf(format, args...))
	}
	switch {
	case d.CIDR != "" && d.Name != "":
		return bad("a prefix or a name, not both")
	case d.CIDR != "":
		p, err := netip.ParsePrefix(d.CIDR)
		if err != nil {
			return bad("not an IPv4 prefix")
		}
		if !p.Addr().Is4() {
			return bad("IPv6 egress is not granted yet")
		}
		if p.Masked() != p || p.String() != d.CIDR {
			return bad("write the masked network, %s", p.Masked())
		}
		a := p.Addr().As4()
		b = append(append(append(b, destPrefix), a[:]...), byte(p.Bits()))
	case d.Name != "":
		if err := checkName(d.Name); err != nil {
			return bad("%v", err)
		}
		b = appendStr(append(b, destName), d.Name)
	default:
		return bad("no prefix and no name")
	}
	proto, ok := protoNumber[d.Proto]
	if !ok {
		return bad("protocol %q: want tcp or udp", d.Proto)
	}
	lo, hi, err := parsePorts(d.Ports)
	if err != nil {
		return bad("%v", err)
	}
	b = append(b, proto)
	b = binary.BigEndian.AppendUint16(b, lo)
	return binary.BigEndian.AppendUint16(b, hi), nil
}

// checkName accepts a DNS name as an egress grant writes it.
func checkName(n string) error {
	if len(n) > 253 {
		return fmt.Errorf("a name is at most 253 bytes")
	}
	if _, err := netip.ParseAddr(n); err == nil {
		return fmt.Errorf("an address is written as a prefix (/32)")
	}
	labels := strings.Split(n, ".")
	if len(labels) < 2 {
		return fmt.Errorf("a name has two labels at least")
	}
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("label %q: 1 to 63 bytes, no hyphen at either end", l)
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("label %q: only a-z, 0-9 and hyphens", l)
			}
		}
	}
	return nil
}

// parsePorts reads "443" or "80-443".
func parsePorts(s string) (lo, hi uint16, _ error) {
	one := func(p string) (uint16, error) {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 || strconv.FormatUint(n, 10) != p {
			return 0, fmt.Errorf("port %q: want 1 to 65535", p)
		}
		return uint16(n), nil
	}
	a, b, isRange := strings.Cut(s, "-")
	lo, err := one(a)
	if err != nil {
		return 0, 0, err
	}
	if !isRange {
		return lo, lo, nil
	}
	if hi, err = one(b); err != nil {
		return 0, 0, err
	}
	if hi <= lo {
		return 0, 0, fmt.Errorf("ports %q: the range's end is not above its start", s)
	}
	return lo, hi, nil
}

// portString writes a port range as Dest.Ports does.
func portString(lo, hi uint16) string {
	if lo == hi {
		return strconv.Itoa(int(lo))
	}
	return strconv.Itoa(int(lo)) + "-" + strconv.Itoa(int(hi))
}

// SortDests puts an allow-list in its canonical order: by its bytes. A
// grant set holds its list in that order, without duplicates.
func SortDests(ds []Dest) {
	slices.SortFunc(ds, func(a, b Dest) int {
		ea, _ := a.encode(nil)
		eb, _ := b.encode(nil)
		return bytes.Compare(ea, eb)
	})
}

// appendEgress appends the egress block of ds, checking each destination
// and the list's order.
func appendEgress(b []byte, ds []Dest) ([]byte, error) {
	if len(ds) == 0 || len(ds) > MaxEgressDests {
		return nil, fmt.Errorf("%w: an egress grant allows 1 to %d destinations, not %d", ErrInvalid, MaxEgressDests, len(ds))
	}
	b = binary.BigEndian.AppendUint32(append(b, egressTag), uint32(len(ds)))
	var prev []byte
	for _, d := range ds {
		e, err := d.encode(nil)
		if err != nil {
			return nil, err
		}
		if prev != nil && bytes.Compare(prev, e) >= 0 {
			return nil, fmt.Errorf("%w: egress destination %s: the list is not in its order (SortDests) or repeats one", ErrInvalid, d)
		}
		prev = e
		b = append(b, e...)
	}
	return b, nil
}

// egress reads an egress block's list after its tag.
func (d *decoder) egress() []Dest {
	n := d.count(11) // a prefix destination's 11 bytes are the fewest
	var ds []Dest
	for range n {
		var x Dest
		switch d.byte1() {
		case destPrefix:
			a := d.take(4)
			bits := d.byte1()
			if d.err != nil {
				return nil
			}
			if bits > 32 {
				d.fail("egress prefix length %d", bits)
				return nil
			}
			x.CIDR = netip.PrefixFrom(netip.AddrFrom4([4]byte(a)), int(bits)).String()
		case destName:
			x.Name = d.str()
		default:
			d.fail("egress destination kind unknown")
			return nil
		}
		proto := d.byte1()
		for name, num := range protoNumber {
			if num == proto {
				x.Proto = name
			}
		}
		lo, hi := d.u16(), d.u16()
		if d.err != nil {
			return nil
		}
		if x.Proto == "" {
			d.fail("egress protocol %d", proto)
			return nil
		}
		x.Ports = portString(lo, hi) // a reversed range fails the re-encoding
		ds = append(ds, x)
	}
	return ds
}

// encodeEgress writes ds's block without checking it (Grants.Encode): a
// destination that is not one is written as nothing.
func encodeEgress(b []byte, ds []Dest) []byte {
	b = binary.BigEndian.AppendUint32(append(b, egressTag), uint32(len(ds)))
	for _, d := range ds {
		e, _ := d.encode(nil)
		b = append(b, e...)
	}
	return b
}
