package attest

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"reflect"
	"testing"
)

// closedExample is docs/attestation.md's closed entry, at closedAtNS.
var closedExample = Closed{Reason: ClosedElsewhere, Total: 2, Conns: []ClosedConn{
	{Local: netip.MustParseAddrPort("10.255.255.2:40312"), Remote: netip.MustParseAddrPort("203.0.113.2:443")},
	{Local: netip.MustParseAddrPort("10.255.255.2:40314"), Remote: netip.MustParseAddrPort("203.0.113.2:443")},
}}

const closedAtNS = 1700000003000000000

// TestClosedPinned pins a closed entry's bytes, written out by hand, and
// its decoding, and round-trips the bounds.
func TestClosedPinned(t *testing.T) {
	e, err := closedExample.Entry(closedAtNS)
	if err != nil {
		t.Fatal(err)
	}
	got := AppendEntry(nil, e.Kind, e.AtNS, e.Data)
	want := mustHex(t, "09 17979cfee8fa5e00 00000021 01 00000002 00000002 0affff02 9d78 cb007102 01bb 0affff02 9d7a cb007102 01bb")
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	var full []ClosedConn
	for i := range MaxClosedConns {
		full = append(full, ClosedConn{Local: netip.MustParseAddrPort("10.255.255.2:1000"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 80)})
	}
	for _, c := range []Closed{closedExample, {Reason: ClosedExpired}, {Reason: ClosedExpired, Total: 1 << 20, Conns: full}} {
		d, err := c.Encode()
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		back, err := DecodeClosed(d)
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("%+v decoded as %+v, %v", c, back, err)
		}
		var j Journal
		j.Add(ClosedKind, 1, d)
		if _, err := DecodeJournal(j.Encode()); err != nil {
			t.Fatalf("%+v in a journal: %v", c, err)
		}
		if err := ScanJournal(bytes.NewReader(j.Encode()), func(EntryKind, int64, io.Reader) error { return nil }); err != nil {
			t.Fatalf("%+v scanned: %v", c, err)
		}
	}
}

// A closed entry not as docs/attestation.md says is refused, by
// DecodeClosed and by both journal readers; Encode refuses to write one.
func TestClosedRefused(t *testing.T) {
	good, err := closedExample.Encode()
	if err != nil {
		t.Fatal(err)
	}
	swapped := append(bytes.Clone(good[:9]), good[21:]...)
	swapped = append(swapped, good[9:21]...)
	over := bytes.Clone(good)
	over[4] = 1 // a total of 1, two listed
	for name, d := range map[string][]byte{
		"empty":              nil,
		"short":              good[:8],
		"reason 0":           append([]byte{0}, good[1:]...),
		"reason 3":           append([]byte{3}, good[1:]...),
		"more than total":    over,
		"a missing byte":     good[:len(good)-1],
		"a trailing byte":    append(bytes.Clone(good), 0),
		"out of order":       swapped,
		"a repeat":           append(append(bytes.Clone(good[:9]), good[9:21]...), good[9:21]...),
		"65 listed":          append([]byte{1, 0, 0, 1, 0, 0, 0, 0, 65}, make([]byte, 65*12)...),
		"count past the end": append([]byte{1, 0, 0, 0, 9, 0, 0, 0, 9}, good[9:]...),
	} {
		if _, err := DecodeClosed(d); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeClosed: %v", name, err)
		}
		var j Journal
		j.Add(ClosedKind, 1, d)
		if _, err := DecodeJournal(j.Encode()); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeJournal: %v", name, err)
		}
		if err := ScanJournal(bytes.NewReader(j.Encode()), func(EntryKind, int64, io.Reader) error { return nil }); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: ScanJournal: %v", name, err)
		}
	}
	v6 := closedExample
	v6.Conns = []ClosedConn{{Local: netip.MustParseAddrPort("[::1]:1"), Remote: netip.MustParseAddrPort("203.0.113.2:443")}}
	rev := closedExample
	rev.Conns = []ClosedConn{closedExample.Conns[1], closedExample.Conns[0]}
	for name, c := range map[string]Closed{
		"no reason": {Total: 0},
		"IPv6":      v6,
		"unsorted":  rev,
		"over":      {Reason: ClosedElsewhere, Total: 1, Conns: closedExample.Conns},
	} {
		if _, err := c.Encode(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Encode: %v", name, err)
		}
	}
}
