package unit

import (
	"encoding/binary"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// limitsTag opens the optional limits block of a grant set's bytes.
const limitsTag = 0x01

// Canonical returns the spec's canonical bytes.
func (s *Spec) Canonical() ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if s.Nonce == "" {
		b := []byte(SpecDomainV1)
		b = appendStr(b, s.Image)
		b = appendStr(b, s.ImageDigest)
		b = appendList(b, s.Args)
		b = appendList(b, s.Env)
		return append(b, byte(s.Mode)), nil
	}
	b := []byte(SpecDomain)
	b = appendStr(b, s.Image)
	b = appendStr(b, s.ImageDigest)
	b = appendList(b, s.Args)
	b = appendList(b, s.Env)
	b = append(b, byte(s.Mode))
	return appendStr(b, s.Nonce), nil
}

// ID returns unit_id: the address of the spec's canonical bytes.
func (s *Spec) ID() (record.Address, error) {
	b, err := s.Canonical()
	if err != nil {
		return record.Address{}, err
	}
	return record.Sum(b), nil
}

// Canonical returns the grant set's canonical bytes.
func (g *Grants) Canonical() ([]byte, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return g.Encode(), nil
}

// Encode writes the grant set's layout without validating it: what a
// forged bundle would carry, for tests that check it is refused.
// Everything else uses Canonical.
func (g *Grants) Encode() []byte {
	b := []byte(GrantsDomain)
	b = binary.BigEndian.AppendUint32(b, g.MilliCPU)
	b = binary.BigEndian.AppendUint64(b, g.MemoryBytes)
	b = append(b, byte(g.Network))
	b = binary.BigEndian.AppendUint32(b, uint32(len(g.ReadOnly)))
	for _, m := range g.ReadOnly {
		b = appendStr(b, m.Source)
		b = appendStr(b, m.Target)
	}
	if l := g.Limits; !l.IsZero() {
		b = append(b, limitsTag)
		b = binary.BigEndian.AppendUint32(b, l.Pids)
		b = binary.BigEndian.AppendUint64(b, l.LogBytes)
		b = binary.BigEndian.AppendUint64(b, l.TranscriptBytes)
		b = binary.BigEndian.AppendUint32(b, l.ChannelConns)
		b = binary.BigEndian.AppendUint64(b, l.ChannelInflightBytes)
		b = binary.BigEndian.AppendUint32(b, l.IntervalCalls)
		b = binary.BigEndian.AppendUint64(b, l.IntervalPayloadBytes)
		b = binary.BigEndian.AppendUint64(b, l.SnapshotBytes)
	}
	if g.Network == Egress || len(g.Egress) > 0 {
		b = encodeEgress(b, g.Egress)
	}
	if len(g.Secrets) > 0 {
		b = append(b, secretsTag)
		b = appendList(b, g.Secrets)
	}
	return b
}

// ID returns grants_id: the address of the grant set's canonical bytes.
func (g *Grants) ID() (record.Address, error) {
	b, err := g.Canonical()
	if err != nil {
		return record.Address{}, err
	}
	return record.Sum(b), nil
}

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func appendList(b []byte, l []string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(l)))
	for _, s := range l {
		b = appendStr(b, s)
	}
	return b
}
