package unit

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// DecodeSpec parses a spec's canonical bytes. It accepts only bytes that
// [Spec.Canonical] writes: the spec must validate (else [ErrInvalid]) and
// re-encode to exactly b (else [ErrMalformed]).
func DecodeSpec(b []byte) (*Spec, error) {
	d := decoder{b: b, what: "spec"}
	v1 := bytes.HasPrefix(b, []byte(SpecDomainV1))
	if v1 {
		d.domain(SpecDomainV1)
	} else {
		d.domain(SpecDomain)
	}
	s := &Spec{Image: d.str(), ImageDigest: d.str(), Args: d.list(), Env: d.list(), Mode: Mode(d.byte1())}
	if !v1 {
		s.Nonce = d.str()
		if d.err == nil && s.Nonce == "" {
			d.fail("a %s spec has an empty nonce", SpecDomain)
		}
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	canon, err := s.Canonical()
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(canon, b) {
		return nil, fmt.Errorf("%w: spec does not re-encode to its bytes", ErrMalformed)
	}
	return s, nil
}

// DecodeGrants parses a grant set's canonical bytes. It accepts only bytes
// that [Grants.Canonical] writes: the grant set must validate (else
// [ErrInvalid]) and re-encode to exactly b (else [ErrMalformed]).
func DecodeGrants(b []byte) (*Grants, error) {
	d := decoder{b: b, what: "grants"}
	d.domain(GrantsDomain)
	g := &Grants{MilliCPU: d.u32(), MemoryBytes: d.u64(), Network: Network(d.byte1())}
	n := d.count(8) // a mount is at least two empty strings
	if n > 0 {
		g.ReadOnly = make([]Mount, 0, n)
	}
	for range n {
		g.ReadOnly = append(g.ReadOnly, Mount{Source: d.str(), Target: d.str()})
	}
	if d.err == nil && len(d.b) > 0 && d.b[0] == limitsTag {
		d.byte1()
		g.Limits = Limits{Pids: d.u32(), LogBytes: d.u64(), TranscriptBytes: d.u64(),
			ChannelConns: d.u32(), ChannelInflightBytes: d.u64(), IntervalCalls: d.u32(),
			IntervalPayloadBytes: d.u64(), SnapshotBytes: d.u64()}
	}
	if d.err == nil && len(d.b) > 0 && d.b[0] == egressTag {
		d.byte1()
		g.Egress = d.egress()
	}
	if d.err == nil && len(d.b) > 0 {
		if tag := d.byte1(); tag != secretsTag {
			d.fail("grants: block tag %#x, want %#x (limits), %#x (egress) or %#x (secrets)", tag, limitsTag, egressTag, secretsTag)
		}
		g.Secrets = d.secrets()
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	canon, err := g.Canonical()
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(canon, b) {
		return nil, fmt.Errorf("%w: grants do not re-encode to their bytes", ErrMalformed)
	}
	return g, nil
}

// decoder reads canonical fields; the first failure sticks and every
// later read returns zero values.
type decoder struct {
	b    []byte
	what string
	err  error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s: %s", ErrMalformed, d.what, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.fail("truncated: %d bytes wanted, %d left", n, len(d.b))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) domain(dom string) {
	if b := d.take(uint64(len(dom))); d.err == nil && string(b) != dom {
		d.err = fmt.Errorf("%w: %s: domain is not %q", ErrMalformed, d.what, dom)
	}
}

func (d *decoder) byte1() byte {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) str() string { return string(d.take(uint64(d.u32()))) }

// count reads a 4-byte count of items of at least least bytes each, refusing
// one the remaining bytes cannot hold before anything is allocated.
func (d *decoder) count(least uint64) uint32 {
	n := d.u32()
	if d.err == nil && uint64(n)*least > uint64(len(d.b)) {
		d.fail("%d items in %d bytes", n, len(d.b))
		return 0
	}
	return n
}

// list reads a counted list of strings; an empty list is nil.
func (d *decoder) list() []string {
	n := d.count(4)
	if n == 0 {
		return nil
	}
	l := make([]string, 0, n)
	for range n {
		l = append(l, d.str())
	}
	return l
}

func (d *decoder) finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}
