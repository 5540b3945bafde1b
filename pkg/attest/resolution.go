package attest

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Resolution is a resolution entry's data: an answer the daemon's
// resolver gave a run for a name its egress grant lists, and so the
// addresses the run was allowed to reach under that name, and for how
// long (docs/unit.md, names in an egress grant).
type Resolution struct {
	Name   string       // 1 to 253 bytes of a-z 0-9 - and dots
	TTLSec uint32       // how long the addresses are allowed, seconds
	Addrs  []netip.Addr // IPv4, at most MaxResolutionAddrs; none: an empty answer
}

// MaxResolutionAddrs bounds a resolution's addresses.
const MaxResolutionAddrs = 8

// maxResolutionSize bounds a resolution entry's data: the name's length
// and bytes, the TTL, the count and the addresses.
const maxResolutionSize = 4 + 253 + 4 + 4 + 4*MaxResolutionAddrs

// Encode is r as a resolution entry's data: the name as a string (a
// 4-byte length, then its bytes), ttl_s (4), the address count (4), then
// each address's 4 bytes. It refuses what DecodeResolution would.
func (r Resolution) Encode() ([]byte, error) {
	if err := checkResolutionName(r.Name); err != nil {
		return nil, err
	}
	if len(r.Addrs) > MaxResolutionAddrs {
		return nil, fmt.Errorf("%w: a resolution of %d addresses, at most %d", ErrMalformed, len(r.Addrs), MaxResolutionAddrs)
	}
	b := appendStr(make([]byte, 0, maxResolutionSize), r.Name)
	b = binary.BigEndian.AppendUint32(b, r.TTLSec)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Addrs)))
	for _, a := range r.Addrs {
		if !a.Is4() {
			return nil, fmt.Errorf("%w: resolution address %s: not IPv4", ErrMalformed, a)
		}
		v := a.As4()
		b = append(b, v[:]...)
	}
	return b, nil
}

// Entry is r as a journal entry at atNS.
func (r Resolution) Entry(atNS int64) (Entry, error) {
	d, err := r.Encode()
	if err != nil {
		return Entry{}, err
	}
	return Entry{Kind: ResolutionKind, AtNS: atNS, Data: d}, nil
}

// DecodeResolution parses a resolution entry's data: a name as Encode
// writes it, at most MaxResolutionAddrs addresses, no trailing byte.
func DecodeResolution(p []byte) (Resolution, error) {
	bad := func(why string) (Resolution, error) {
		return Resolution{}, fmt.Errorf("%w: resolution entry: %s", ErrMalformed, why)
	}
	if len(p) < 4 {
		return bad("short")
	}
	n := binary.BigEndian.Uint32(p)
	if n > 253 || uint64(len(p)) < 4+uint64(n)+8 {
		return bad("name length")
	}
	r := Resolution{Name: string(p[4 : 4+n])}
	if err := checkResolutionName(r.Name); err != nil {
		return Resolution{}, err
	}
	p = p[4+n:]
	r.TTLSec = binary.BigEndian.Uint32(p)
	count := binary.BigEndian.Uint32(p[4:])
	p = p[8:]
	if count > MaxResolutionAddrs || uint64(len(p)) != 4*uint64(count) {
		return bad("address count")
	}
	for i := range int(count) {
		r.Addrs = append(r.Addrs, netip.AddrFrom4([4]byte(p[4*i:4*i+4])))
	}
	return r, nil
}

// checkResolutionName accepts 1 to 253 bytes of a-z 0-9 - and dots, no
// empty label.
func checkResolutionName(n string) error {
	if len(n) == 0 || len(n) > 253 || n[0] == '.' || n[len(n)-1] == '.' {
		return fmt.Errorf("%w: resolution name %q", ErrMalformed, n)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') || c == '.' && n[i-1] == '.' {
			return fmt.Errorf("%w: resolution name %q", ErrMalformed, n)
		}
	}
	return nil
}
