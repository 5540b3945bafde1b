package attest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Closed is a closed entry's data: the TCP connections to outside that
// a resume of a run with an egress grant closed (aborted) before its
// sandbox got the outside's packets again, because this host held no
// state of them (docs/unit.md, "Grant set": what an egress grant gives).
type Closed struct {
	Reason ClosedReason
	// Total is how many were closed; Conns lists the first
	// MaxClosedConns of them, in ascending order of their bytes.
	Total uint32
	Conns []ClosedConn
}

// ClosedReason says why a resume closed a run's connections to outside.
type ClosedReason uint8

const (
	// ClosedElsewhere: the host held no state of them: the run was
	// parked on another host, or left this one and came back, or this
	// host restarted since the park.
	ClosedElsewhere ClosedReason = 1
	// ClosedExpired: the run stayed parked here past the host's hold
	// (serve --egress-park-hold), which then removed their state.
	ClosedExpired ClosedReason = 2
)

// ClosedConn is one connection closed: the sandbox's IPv4 address and
// port, and the remote's.
type ClosedConn struct {
	Local, Remote netip.AddrPort
}

// MaxClosedConns bounds the connections a closed entry lists.
const MaxClosedConns = 64

// closedConnSize is a listed connection's size: two addresses, two ports.
const closedConnSize = 12

// maxClosedSize bounds a closed entry's data.
const maxClosedSize = 9 + closedConnSize*MaxClosedConns

func (c ClosedConn) append(b []byte) ([]byte, error) {
	if !c.Local.Addr().Is4() || !c.Remote.Addr().Is4() {
		return nil, fmt.Errorf("%w: closed connection %s-%s: not IPv4", ErrMalformed, c.Local, c.Remote)
	}
	l, r := c.Local.Addr().As4(), c.Remote.Addr().As4()
	b = binary.BigEndian.AppendUint16(append(b, l[:]...), c.Local.Port())
	return binary.BigEndian.AppendUint16(append(b, r[:]...), c.Remote.Port()), nil
}

// Encode is c as a closed entry's data: the reason (1), the total (4),
// the count listed (4), then each listed connection: local address (4),
// local port (2), remote address (4), remote port (2). It refuses what
// DecodeClosed would.
func (c Closed) Encode() ([]byte, error) {
	if c.Reason != ClosedElsewhere && c.Reason != ClosedExpired {
		return nil, fmt.Errorf("%w: closed entry reason %d", ErrMalformed, c.Reason)
	}
	if len(c.Conns) > MaxClosedConns || uint64(len(c.Conns)) > uint64(c.Total) {
		return nil, fmt.Errorf("%w: closed entry listing %d of %d connections", ErrMalformed, len(c.Conns), c.Total)
	}
	b := append(make([]byte, 0, 9+closedConnSize*len(c.Conns)), byte(c.Reason))
	b = binary.BigEndian.AppendUint32(b, c.Total)
	b = binary.BigEndian.AppendUint32(b, uint32(len(c.Conns)))
	for i, cn := range c.Conns {
		var err error
		if b, err = cn.append(b); err != nil {
			return nil, err
		}
		if i > 0 {
			at := len(b) - closedConnSize
			if bytes.Compare(b[at-closedConnSize:at], b[at:]) >= 0 {
				return nil, fmt.Errorf("%w: closed connections not in ascending order", ErrMalformed)
			}
		}
	}
	return b, nil
}

// Entry is c as a journal entry at atNS.
func (c Closed) Entry(atNS int64) (Entry, error) {
	d, err := c.Encode()
	if err != nil {
		return Entry{}, err
	}
	return Entry{Kind: ClosedKind, AtNS: atNS, Data: d}, nil
}

// DecodeClosed parses a closed entry's data: a reason of ClosedReason's,
// at most MaxClosedConns listed and no more than the total, listed in
// strictly ascending order of their bytes, no trailing byte.
func DecodeClosed(p []byte) (Closed, error) {
	bad := func(why string) (Closed, error) {
		return Closed{}, fmt.Errorf("%w: closed entry: %s", ErrMalformed, why)
	}
	if len(p) < 9 {
		return bad("short")
	}
	c := Closed{Reason: ClosedReason(p[0]), Total: binary.BigEndian.Uint32(p[1:])}
	if c.Reason != ClosedElsewhere && c.Reason != ClosedExpired {
		return bad(fmt.Sprintf("reason %d", p[0]))
	}
	n := binary.BigEndian.Uint32(p[5:])
	if n > MaxClosedConns || n > c.Total || uint64(len(p)) != 9+closedConnSize*uint64(n) {
		return bad("connection count")
	}
	for i := range int(n) {
		e := p[9+closedConnSize*i:]
		if i > 0 && bytes.Compare(p[9+closedConnSize*(i-1):9+closedConnSize*i], e[:closedConnSize]) >= 0 {
			return bad("connections not in ascending order")
		}
		c.Conns = append(c.Conns, ClosedConn{
			Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte(e[:4])), binary.BigEndian.Uint16(e[4:])),
			Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte(e[6:10])), binary.BigEndian.Uint16(e[10:])),
		})
	}
	return c, nil
}
