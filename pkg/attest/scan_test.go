package attest

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestScanJournal(t *testing.T) {
	var j Journal
	j.Add(Stdout, 1, []byte("out"))
	j.Entries = append(j.Entries, Event(2, "parked"))
	j.Add(Stderr, 3, nil)
	enc := j.Encode()
	var got Journal
	err := ScanJournal(bytes.NewReader(enc), func(k EntryKind, at int64, data io.Reader) error {
		b, err := io.ReadAll(data)
		got.Add(k, at, b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Encode(), enc) {
		t.Fatalf("scanned %+v, want %+v", got.Entries, j.Entries)
	}
	// Entries left unread are skipped.
	n := 0
	if err := ScanJournal(bytes.NewReader(enc), func(EntryKind, int64, io.Reader) error { n++; return nil }); err != nil || n != 3 {
		t.Fatalf("skipping: %d entries, err %v", n, err)
	}
	// fn's error stops the scan.
	stop := errors.New("stop")
	if err := ScanJournal(bytes.NewReader(enc), func(EntryKind, int64, io.Reader) error { return stop }); err != stop {
		t.Fatalf("err %v, want fn's", err)
	}
	for name, b := range map[string][]byte{
		"truncated": enc[:len(enc)-1],
		"trailing":  append(bytes.Clone(enc), 0),
		"domain":    append([]byte("x"), enc[1:]...),
		"kind":      append(bytes.Clone(enc[:len(JournalDomain)+4]), append([]byte{9}, enc[len(JournalDomain)+5:]...)...),
		"count":     append(append(bytes.Clone(enc[:len(JournalDomain)]), 0, 0, 0, 4), enc[len(JournalDomain)+4:]...),
	} {
		err := ScanJournal(bytes.NewReader(b), func(EntryKind, int64, io.Reader) error { return nil })
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
		if _, derr := DecodeJournal(b); !errors.Is(derr, ErrMalformed) {
			t.Errorf("%s: DecodeJournal takes it (%v): the test's input is not malformed", name, derr)
		}
	}
}
