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

// The empty record's wire form, over the worked example's ids
// (docs/record-format.md shows these bytes).
func TestWireEmptyRecordPinned(t *testing.T) {
	const want = `{"format":"sandbox.runrecord/1","unit_id":"b3:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE",` +
		`"grants_id":"b3:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI","genesis":"b3:pRt5_jj6hL29tkxke_KVi-S747ez0Z35wljzuG6Z2Vw",` +
		`"segments":[],"head":"b3:pRt5_jj6hL29tkxke_KVi-S747ez0Z35wljzuG6Z2Vw"}` + "\n"
	r := New(fill(1), fill(2))
	if got := string(r.EncodeWire()); got != want {
		t.Fatalf("empty record:\n got %s\nwant %s", got, want)
	}
	if _, err := DecodeWire([]byte(want)); err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string]string{
		"null segments":    strings.Replace(want, `"segments":[]`, `"segments":null`, 1),
		"missing segments": strings.Replace(want, `"segments":[],`, ``, 1),
		"missing head":     strings.Replace(want, `,"head":"b3:pRt5_jj6hL29tkxke_KVi-S747ez0Z35wljzuG6Z2Vw"}`, `}`, 1),
	} {
		if _, err := DecodeWire([]byte(in)); !errors.Is(err, ErrCanonical) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Strings are written as Go's encoding/json writes them without HTML
// escaping; docs/record-format.md lists the rules and a reader must apply
// them exactly, for a record has one wire form.
func TestWireStringEscapes(t *testing.T) {
	reason := "a\u2028b\u2029c\bd\fe\x1ff\x7fg é <&>/ \"q\" \\ \n\t\r\x00"
	const written = `"reason":"a\u2028b\u2029c\bd\fe\u001ff` + "\x7f" + `g é <&>/ \"q\" \\ \n\t\r\u0000"`
	r := mustRecord(t)
	mustAppend(t, r, Execution(fill(0xaa), &CallAccount{Dispatched: []string{"é\u2028"}}))
	mustAppend(t, r, Closure(reason))
	b := r.EncodeWire()
	if !bytes.Contains(b, []byte(written)) || !bytes.Contains(b, []byte(`"dispatched":["é\u2028"]`)) {
		t.Fatalf("wire form writes strings otherwise: %s", b)
	}
	// Another spelling of the same string is refused and the segment named.
	for name, spelt := range map[string]string{
		"escaped non-ASCII": strings.Replace(written, "é", `\u00e9`, 1),
		"uppercase hex":     strings.Replace(written, `\u001f`, `\u001F`, 1),
		"\\u0008 for \\b":   strings.Replace(written, `\b`, `\u0008`, 1),
		"raw U+2028":        strings.Replace(written, `\u2028`, "\u2028", 1),
		"escaped solidus":   strings.Replace(written, `>/`, `>\/`, 1),
		"escaped DEL":       strings.Replace(written, "\x7f", `\u007f`, 1),
		"HTML-escaped <":    strings.Replace(written, "<", `\u003c`, 1),
	} {
		_, err := DecodeWire(bytes.Replace(b, []byte(written), []byte(spelt), 1))
		var se *SegmentError
		if !errors.Is(err, ErrCanonical) || !errors.As(err, &se) || se.Index != 1 {
			t.Errorf("%s: err = %v, want not canonical at segment 1", name, err)
		}
	}
}

// A segment edited in a way that breaks its form, not only its hash, is
// named too.
func TestWireEditedSegmentNamed(t *testing.T) {
	b := sampleRecord(t).EncodeWire()
	for _, c := range []struct {
		name     string
		old, new string
		seg      int
		want     error
	}{
		{"unknown key", `{"kind":"resumed",`, `{"kind":"resumed","x":1,`, 2, ErrCanonical},
		{"idle_uj as 7.0", `"idle_uj":1234`, `"idle_uj":1234.0`, 2, ErrCanonical},
		{"malformed address", `"manifest":"b3:`, `"manifest":"b3:x`, 1, ErrCanonical},
		{"missing idle_uj", `"idle_uj":1234,`, ``, 2, ErrCanonical},
		{"missing reason", `"reason":"abandoned <&>",`, ``, 5, ErrCanonical},
		{"missing resolved list", `,"resolved":[]`, ``, 0, ErrCanonical},
		{"null dispatched list", `"dispatched":[]`, `"dispatched":null`, 3, ErrCanonical},
		{"space inside a segment", `"kind":"closed",`, `"kind": "closed",`, 5, ErrCanonical},
		{"zero root", `"root":"` + fill(0x20).String(), `"root":"` + Address{}.String(), 1, ErrMalformedSnapshot},
	} {
		if !bytes.Contains(b, []byte(c.old)) {
			t.Fatalf("%s: %q not in the wire form", c.name, c.old)
		}
		_, err := DecodeWire(bytes.Replace(b, []byte(c.old), []byte(c.new), 1))
		var se *SegmentError
		if !errors.Is(err, c.want) || !errors.As(err, &se) || se.Index != c.seg {
			t.Errorf("%s: err = %v, want %v at segment %d", c.name, err, c.want, c.seg)
		}
	}
}

// A key of another kind is a stray field whatever its value: a zero value
// is stated as surely as any other, so it is refused as one
// (docs/record-format.md, "Wire form"), in a lone segment and in a record.
func TestStrayKeyRefusedWhateverItsValue(t *testing.T) {
	att, man := `"attestation":"`+fill(0xaa).String()+`"`, `"manifest":"`+fill(0xdd).String()+`"`
	snap := `"snapshot":{"transcript":"` + fill(0xee).String() + `"}`
	zero := Address{}.String()
	for _, c := range []struct{ name, seg string }{
		{"executed, empty snapshot", `{"kind":"executed",` + att + `,"snapshot":{}}`},
		{"executed, empty reason", `{"kind":"executed",` + att + `,"reason":""}`},
		{"executed, zero idle_uj", `{"kind":"executed",` + att + `,"idle_uj":0}`},
		{"suspended, empty reason", `{"kind":"suspended",` + snap + `,` + man + `,"reason":""}`},
		{"closed, zero attestation", `{"kind":"closed","attestation":"` + zero + `","reason":"x"}`},
		{"closed, zero manifest", `{"kind":"closed","manifest":"` + zero + `","reason":"x"}`},
	} {
		var s Segment
		if err := json.Unmarshal([]byte(c.seg), &s); err != nil {
			t.Errorf("%s: does not decode: %v", c.name, err)
			continue
		}
		if err := s.Validate(); !errors.Is(err, ErrMalformedSegment) {
			t.Errorf("%s: Validate = %v, want ErrMalformedSegment", c.name, err)
		}
		if _, err := New(fill(1), fill(2)).Append(s); !errors.Is(err, ErrMalformedSegment) {
			t.Errorf("%s: Append = %v, want ErrMalformedSegment", c.name, err)
		}
	}
	// In a record's wire form, the stray key names its segment.
	b := sampleRecord(t).EncodeWire()
	for _, c := range []struct {
		name, old, new string
		seg            int
	}{
		{"executed, empty reason", `"calls":{"dispatched":["build-1"],"resolved":[]}`, `"calls":{"dispatched":["build-1"],"resolved":[]},"reason":""`, 0},
		{"resumed, empty reason", `"provenance":"estimated"`, `"provenance":"estimated","reason":""`, 2},
		{"closed, zero manifest", `{"kind":"closed",`, `{"kind":"closed","manifest":"` + zero + `",`, 5},
	} {
		_, err := DecodeWire(bytes.Replace(b, []byte(c.old), []byte(c.new), 1))
		var se *SegmentError
		if !errors.Is(err, ErrMalformedSegment) || !errors.As(err, &se) || se.Index != c.seg {
			t.Errorf("%s: err = %v, want ErrMalformedSegment at segment %d", c.name, err, c.seg)
		}
	}
}

// A key twice in one object, a key spelled in another case, and a null
// value are refused as not canonical: encoding/json would keep the last
// of two, fold "Kind" to "kind", and read null as absent.
func TestWireKeysExact(t *testing.T) {
	b := sampleRecord(t).EncodeWire()
	for _, c := range []struct {
		name, old, new string
		seg            int // -1: the record's own keys
	}{
		{"reason twice", `"reason":"abandoned <&>"`, `"reason":"x","reason":"abandoned <&>"`, 5},
		{"kind twice", `{"kind":"closed",`, `{"kind":"closed","kind":"closed",`, 5},
		{"root twice", `"snapshot":{"root":"`, `"snapshot":{"root":"` + fill(9).String() + `","root":"`, 1},
		{"resolved twice", `"resolved":[]`, `"resolved":["z"],"resolved":[]`, 0},
		{"Kind", `{"kind":"closed",`, `{"Kind":"closed",`, 5},
		{"null memory", `"snapshot":{"transcript"`, `"snapshot":{"memory":null,"transcript"`, 4},
		{"null manifest on closed", `{"kind":"closed",`, `{"kind":"closed","manifest":null,`, 5},
		{"format twice", `{"format":"sandbox.runrecord/1",`, `{"format":"sandbox.runrecord/1","format":"sandbox.runrecord/1",`, -1},
		{"Head", `],"head":`, `],"Head":`, -1},
	} {
		if !bytes.Contains(b, []byte(c.old)) {
			t.Fatalf("%s: %q not in the wire form", c.name, c.old)
		}
		_, err := DecodeWire(bytes.Replace(b, []byte(c.old), []byte(c.new), 1))
		var se *SegmentError
		named := errors.As(err, &se)
		if !errors.Is(err, ErrCanonical) || named != (c.seg >= 0) || (named && se.Index != c.seg) {
			t.Errorf("%s: err = %v, want ErrCanonical at segment %d", c.name, err, c.seg)
		}
	}
	var s Segment
	for name, seg := range map[string]string{
		"reason twice": `{"kind":"closed","reason":"a","reason":"b"}`,
		"Reason":       `{"kind":"closed","Reason":"a"}`,
		"null reason":  `{"kind":"closed","reason":null}`,
	} {
		if err := json.Unmarshal([]byte(seg), &s); !errors.Is(err, ErrCanonical) {
			t.Errorf("lone segment, %s: %v, want ErrCanonical", name, err)
		}
	}
}

// An address text that does not parse inside a wire form is Canonical and
// only that: one refusal, one name (docs/record-format.md, "Names at the
// edges"). Address is a zero unit or grant-set id, and ParseAddress's.
func TestWireMalformedAddressOneName(t *testing.T) {
	b := sampleRecord(t).EncodeWire()
	for name, c := range map[string]struct{ old, new string }{
		"in a segment":      {`"manifest":"b3:`, `"manifest":"b3:x`},
		"the record's head": {`],"head":"b3:`, `],"head":"b3:x`},
		"the unit id":       {`"unit_id":"b3:`, `"unit_id":"b4:`},
		"in a snapshot":     {`"snapshot":{"root":"b3:`, `"snapshot":{"root":"b3:=`},
	} {
		_, err := DecodeWire(bytes.Replace(b, []byte(c.old), []byte(c.new), 1))
		if !errors.Is(err, ErrCanonical) || errors.Is(err, ErrAddress) {
			t.Errorf("%s: err = %v, want ErrCanonical alone", name, err)
		}
	}
	zero := strings.Replace(string(b), `"unit_id":"`+fill(1).String(), `"unit_id":"`+Address{}.String(), 1)
	if _, err := DecodeWire([]byte(zero)); !errors.Is(err, ErrAddress) || errors.Is(err, ErrCanonical) {
		t.Errorf("zero unit id: err = %v, want ErrAddress alone", err)
	}
}
