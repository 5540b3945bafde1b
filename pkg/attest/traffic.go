package attest

import (
	"encoding/binary"
	"fmt"
)

// Traffic is a traffic entry's data: what a run's egress link let through
// in the interval, IPv4 packets and their bytes (IP headers included),
// into the sandbox and out of it. Reset says the host's counters were
// found below the interval's starting values (the host restarted, or the
// run's rules were installed again): the figures count from then, and
// are a lower bound.
type Traffic struct {
	InBytes, InPackets, OutBytes, OutPackets uint64
	Reset                                    bool
}

// TrafficSize is a traffic entry's data size: four 8-byte counts and a
// flags byte.
const TrafficSize = 33

// trafficReset is the flags bit of Traffic.Reset; the others are zero.
const trafficReset = 0x01

// Encode is t as a traffic entry's data: in_bytes, in_packets, out_bytes,
// out_packets (8 bytes each, big-endian), then flags (bit 0: Reset).
func (t Traffic) Encode() []byte {
	b := make([]byte, 0, TrafficSize)
	for _, n := range []uint64{t.InBytes, t.InPackets, t.OutBytes, t.OutPackets} {
		b = binary.BigEndian.AppendUint64(b, n)
	}
	var flags byte
	if t.Reset {
		flags |= trafficReset
	}
	return append(b, flags)
}

// Entry is t as a journal entry at atNS.
func (t Traffic) Entry(atNS int64) Entry {
	return Entry{Kind: TrafficKind, AtNS: atNS, Data: t.Encode()}
}

// DecodeTraffic parses a traffic entry's data: exactly TrafficSize bytes,
// no flag but Reset.
func DecodeTraffic(p []byte) (Traffic, error) {
	if len(p) != TrafficSize {
		return Traffic{}, fmt.Errorf("%w: traffic entry of %d bytes, want %d", ErrMalformed, len(p), TrafficSize)
	}
	if p[32]&^trafficReset != 0 {
		return Traffic{}, fmt.Errorf("%w: traffic entry flags %#02x", ErrMalformed, p[32])
	}
	u := func(i int) uint64 { return binary.BigEndian.Uint64(p[8*i:]) }
	return Traffic{InBytes: u(0), InPackets: u(1), OutBytes: u(2), OutPackets: u(3), Reset: p[32] == trafficReset}, nil
}
