package attest

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// resolutionExample is docs/attestation.md's resolution entry, at
// resolutionAtNS.
var resolutionExample = Resolution{Name: "pypi.org", TTLSec: 300,
	Addrs: []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")}}

const resolutionAtNS = 1700000002000000000

// TestResolutionPinned pins a resolution entry's bytes, written out by
// hand, and its decoding.
func TestResolutionPinned(t *testing.T) {
	e, err := resolutionExample.Entry(resolutionAtNS)
	if err != nil {
		t.Fatal(err)
	}
	got := AppendEntry(nil, e.Kind, e.AtNS, e.Data)
	want := mustHex(t, "08 17979cfead5f9400 0000001c 00000008 707970692e6f7267 0000012c 00000002 cb00710a cb00710b")
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
	var eight []netip.Addr
	for i := range MaxResolutionAddrs {
		eight = append(eight, netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}))
	}
	for _, r := range []Resolution{resolutionExample, {Name: "a.b", TTLSec: 5}, {Name: long, TTLSec: 3600, Addrs: eight}} {
		d, err := r.Encode()
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		back, err := DecodeResolution(d)
		if err != nil || !reflect.DeepEqual(back, r) {
			t.Fatalf("%+v decoded as %+v, %v", r, back, err)
		}
		var j Journal
		j.Add(ResolutionKind, 1, d)
		if _, err := DecodeJournal(j.Encode()); err != nil {
			t.Fatalf("%+v in a journal: %v", r, err)
		}
		if err := ScanJournal(bytes.NewReader(j.Encode()), func(EntryKind, int64, io.Reader) error { return nil }); err != nil {
			t.Fatalf("%+v scanned: %v", r, err)
		}
	}
}

// A resolution entry not as docs/attestation.md says is refused, by
// DecodeResolution and by both journal readers; Encode refuses to write
// one.
func TestResolutionRefused(t *testing.T) {
	good, err := resolutionExample.Encode()
	if err != nil {
		t.Fatal(err)
	}
	nine := append(bytes.Clone(good[:16]), 0, 0, 0, 9)
	for range 9 {
		nine = append(nine, 1, 2, 3, 4)
	}
	for name, d := range map[string][]byte{
		"empty":             nil,
		"short":             good[:3],
		"name too long":     append([]byte{0, 0, 0, 254}, make([]byte, 300)...),
		"name past end":     []byte{0, 0, 0, 9, 'a', '.', 'b'},
		"upper case":        bytes.Replace(good, []byte("pypi"), []byte("PyPI"), 1),
		"empty label":       bytes.Replace(good, []byte("pypi.org"), []byte("pypi..rg"), 1),
		"empty name":        append([]byte{0, 0, 0, 0}, good[12:]...),
		"a missing address": good[:len(good)-1],
		"a trailing byte":   append(bytes.Clone(good), 0),
		"nine addresses":    nine,
	} {
		if _, err := DecodeResolution(d); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeResolution: %v", name, err)
		}
		var j Journal
		j.Add(ResolutionKind, 1, d)
		enc := j.Encode()
		if _, err := DecodeJournal(enc); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeJournal: %v", name, err)
		}
		err := ScanJournal(bytes.NewReader(enc), func(EntryKind, int64, io.Reader) error { return nil })
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: ScanJournal: %v", name, err)
		}
	}
	for _, r := range []Resolution{
		{Name: "Pypi.org"}, {Name: ""}, {Name: "a.b.", TTLSec: 1},
		{Name: "a.b", Addrs: []netip.Addr{netip.MustParseAddr("2001:db8::1")}},
		{Name: "a.b", Addrs: make([]netip.Addr, 9)},
	} {
		if _, err := r.Encode(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%+v encoded: %v", r, err)
		}
	}
	var jk Journal
	jk.Add(ResolutionKind+1, 1, nil)
	if _, err := DecodeJournal(jk.Encode()); !errors.Is(err, ErrMalformed) {
		t.Fatalf("kind 9: %v", err)
	}
}
