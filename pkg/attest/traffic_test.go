package attest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// trafficExample is docs/attestation.md's traffic entry.
var trafficExample = Traffic{InBytes: 1100000, InPackets: 760, OutBytes: 40000, OutPackets: 750}.Entry(1700000001000000000)

// TestTrafficPinned pins a traffic entry's bytes, written out by hand, and
// its decoding.
func TestTrafficPinned(t *testing.T) {
	got := AppendEntry(nil, trafficExample.Kind, trafficExample.AtNS, trafficExample.Data)
	want := mustHex(t, "07 17979cfe71c4ca00 00000021 000000000010c8e0 00000000000002f8 0000000000009c40 00000000000002ee 00")
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	reset := Traffic{InBytes: 1, Reset: true}
	if b := reset.Encode(); b[32] != 0x01 || len(b) != TrafficSize {
		t.Fatalf("reset: %x", b)
	}
	for _, tr := range []Traffic{{InBytes: 1100000, InPackets: 760, OutBytes: 40000, OutPackets: 750}, reset, {OutPackets: ^uint64(0)}} {
		back, err := DecodeTraffic(tr.Encode())
		if err != nil || back != tr {
			t.Fatalf("%+v decoded as %+v, %v", tr, back, err)
		}
	}
}

// A traffic entry of another size or with an unknown flag is refused, by
// DecodeTraffic and by both journal readers.
func TestTrafficRefused(t *testing.T) {
	good := Traffic{InBytes: 5}.Encode()
	for name, d := range map[string][]byte{
		"short":        good[:32],
		"long":         append(bytes.Clone(good), 0),
		"unknown flag": append(bytes.Clone(good[:32]), 0x02),
		"empty":        nil,
	} {
		if _, err := DecodeTraffic(d); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeTraffic: %v", name, err)
		}
		var j Journal
		j.Add(TrafficKind, 1, d)
		enc := j.Encode()
		if _, err := DecodeJournal(enc); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeJournal: %v", name, err)
		}
		err := ScanJournal(bytes.NewReader(enc), func(EntryKind, int64, io.Reader) error { return nil })
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: ScanJournal: %v", name, err)
		}
	}
	var j Journal
	j.Entries = append(j.Entries, trafficExample)
	back, err := DecodeJournal(j.Encode())
	if err != nil || len(back.Entries) != 1 {
		t.Fatalf("a good traffic entry: %v", err)
	}
	var scanned []byte
	err = ScanJournal(bytes.NewReader(j.Encode()), func(k EntryKind, _ int64, r io.Reader) error {
		scanned, err = io.ReadAll(r)
		return err
	})
	if err != nil || !bytes.Equal(scanned, trafficExample.Data) {
		t.Fatalf("scanned %x, %v", scanned, err)
	}
	var jk Journal
	jk.Add(TrafficKind+1, 1, nil)
	if _, err := DecodeJournal(jk.Encode()); !errors.Is(err, ErrMalformed) {
		t.Fatalf("kind 8: %v", err)
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// A hostile journal's traffic entry saying it holds 256 MiB is refused
// on its length, before its data is read: ScanJournal reads a journal
// entry by entry, never a large one into memory.
func TestScanJournalRefusesALongTrafficEntryUnread(t *testing.T) {
	const long = 256 << 20
	head := binary.BigEndian.AppendUint32([]byte(JournalDomain), 1)
	head = append(head, byte(TrafficKind))
	head = binary.BigEndian.AppendUint64(head, 1)
	head = binary.BigEndian.AppendUint32(head, long)
	src := &countingReader{r: io.MultiReader(bytes.NewReader(head), io.LimitReader(zeros{}, long))}
	err := ScanJournal(src, func(EntryKind, int64, io.Reader) error { return nil })
	if !errors.Is(err, ErrMalformed) || src.n > 1<<20 {
		t.Fatalf("%v, after reading %d bytes", err, src.n)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
