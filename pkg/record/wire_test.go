package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func sampleRecord(t *testing.T) *Record {
	r := mustRecord(t)
	mustAppend(t, r, Execution(fill(0x10), &CallAccount{Dispatched: []string{"build-1"}}))
	mustAppend(t, r, Suspension(img(0x20, 0x21), fill(0x30)))
	mustAppend(t, r, Resumption(img(0x20, 0x21), 1234, Estimated))
	mustAppend(t, r, Execution(fill(0x11), &CallAccount{Resolved: []string{"build-1"}}))
	mustAppend(t, r, Suspension(TranscriptSnapshot(fill(0x22)), fill(0x31)))
	mustAppend(t, r, Closure("abandoned <&>"))
	return r
}

func TestWireRoundTrip(t *testing.T) {
	r := sampleRecord(t)
	b := r.EncodeWire()
	back, err := DecodeWire(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.Head() != r.Head() || !bytes.Equal(back.EncodeWire(), b) {
		t.Fatal("round trip changed the record")
	}
	if !bytes.Contains(b, []byte(`"reason":"abandoned <&>"`)) {
		t.Fatalf("wire form escapes text: %s", b)
	}
}

func TestWireTamperedSnapshotFails(t *testing.T) {
	r := sampleRecord(t)
	b := r.EncodeWire()
	// Point the suspended image's memory at another object.
	old, repl := `"memory":"`+fill(0x21).String(), `"memory":"`+fill(0x29).String()
	edited := bytes.Replace(b, []byte(old), []byte(repl), 1)
	_, err := DecodeWire(edited)
	var se *SegmentError
	if !errors.Is(err, ErrHeadMismatch) || !errors.As(err, &se) || se.Index != 1 {
		t.Fatalf("err = %v, want head mismatch at segment 1", err)
	}
	// Edit both the suspension and the resumption consistently: the first
	// edited head still fails.
	edited = bytes.ReplaceAll(b, []byte(old), []byte(repl))
	if _, err := DecodeWire(edited); !errors.As(err, &se) || se.Index != 1 {
		t.Fatalf("err = %v, want failure at segment 1", err)
	}
	// Turn the image into both forms: refused as malformed, not hashed.
	edited = bytes.Replace(b, []byte(`"snapshot":{"root"`), []byte(`"snapshot":{"transcript":"`+fill(5).String()+`","root"`), 1)
	if _, err := DecodeWire(edited); !errors.Is(err, ErrMalformedSnapshot) {
		t.Fatalf("err = %v, want ErrMalformedSnapshot", err)
	}
}

func TestWireRefusesNonCanonical(t *testing.T) {
	b := sampleRecord(t).EncodeWire()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	pretty, _ := json.MarshalIndent(v, "", "  ")
	for name, in := range map[string][]byte{
		"indented":      pretty,
		"no newline":    bytes.TrimSuffix(b, []byte("\n")),
		"unknown field": bytes.Replace(b, []byte(`{"format"`), []byte(`{"x":1,"format"`), 1),
		"null ids":      bytes.Replace(b, []byte(`"resolved":[]`), []byte(`"resolved":null`), 1),
		"trailing":      append(append([]byte{}, b...), []byte("{}")...),
	} {
		if _, err := DecodeWire(in); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := DecodeWire(bytes.Replace(b, []byte(`"head":"`), []byte(`"head":"x`), 1)); err == nil || !strings.Contains(err.Error(), "address") {
		t.Errorf("bad address: %v", err)
	}
}

func TestSegmentJSON(t *testing.T) {
	for _, p := range pins {
		b, err := json.Marshal(p.seg)
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		var back Segment
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: %s: %v", p.name, b, err)
		}
		x, _ := p.seg.Canonical()
		y, _ := back.Canonical()
		if !bytes.Equal(x, y) {
			t.Errorf("%s: JSON round trip changed canonical bytes", p.name)
		}
	}
}
