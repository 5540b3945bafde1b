package record

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"lukechampine.com/blake3"
)

// Each layout below is written out by hand from docs/record-format.md and
// does not use the encoder.
var pins = []struct {
	name string
	seg  Segment
	hex  string
}{
	{"executed, no account", Execution(fill(0xaa), nil),
		"01 aa*32 00"},
	{"executed, empty account", Execution(fill(0xaa), &CallAccount{}),
		"01 aa*32 01 00000000 00000000"},
	{"executed, account", Execution(fill(0xaa), &CallAccount{Dispatched: []string{"b1", "t"}, Resolved: []string{"r"}}),
		"01 aa*32 01 00000002 00000002 6231 00000001 74 00000001 00000001 72"},
	{"suspended, image without memory", Suspension(ImageSnapshot(fill(0xbb), nil), fill(0xdd)),
		"02 01 bb*32 00 dd*32"},
	{"suspended, image with memory", Suspension(ImageSnapshot(fill(0xbb), ptr(fill(0xcc))), fill(0xdd)),
		"02 01 bb*32 01 cc*32 dd*32"},
	{"suspended, transcript", Suspension(TranscriptSnapshot(fill(0xee)), fill(0xdd)),
		"02 02 ee*32 dd*32"},
	{"resumed, image, estimated", Resumption(ImageSnapshot(fill(0xbb), ptr(fill(0xcc))), 0x0102030405060708, Estimated),
		"03 01 bb*32 01 cc*32 0102030405060708 02"},
	{"resumed, transcript, measured", Resumption(TranscriptSnapshot(fill(0xee)), 1, Measured),
		"03 02 ee*32 0000000000000001 01"},
	{"closed", Closure("done"),
		"04 00000004 646f6e65"},
	{"closed, empty reason", Closure(""),
		"04 00000000"},
}

func TestCanonicalPins(t *testing.T) {
	for _, p := range pins {
		want := hx(t, p.hex)
		got, err := p.seg.Canonical()
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", p.name, got, want)
		}
		back, err := DecodeSegment(want)
		if err != nil {
			t.Fatalf("%s: decode: %v", p.name, err)
		}
		again, _ := back.Canonical()
		if !bytes.Equal(again, want) {
			t.Errorf("%s: decode/encode changed the bytes: %x", p.name, again)
		}
	}
}

func TestAbsentAndEmptyAccountDiffer(t *testing.T) {
	a, _ := Execution(fill(1), nil).Canonical()
	b, _ := Execution(fill(1), &CallAccount{}).Canonical()
	if bytes.Equal(a, b) {
		t.Fatal("absent and empty account have the same bytes")
	}
	r1, r2 := mustRecord(t), mustRecord(t)
	h1 := mustAppend(t, r1, Execution(fill(1), nil))
	h2 := mustAppend(t, r2, Execution(fill(1), &CallAccount{}))
	if h1 == h2 {
		t.Fatal("absent and empty account fold to the same head")
	}
}

func TestIDBoundariesUnambiguous(t *testing.T) {
	a, _ := Execution(fill(1), &CallAccount{Dispatched: []string{"ab", "c"}}).Canonical()
	b, _ := Execution(fill(1), &CallAccount{Dispatched: []string{"a", "bc"}}).Canonical()
	c, _ := Execution(fill(1), &CallAccount{Dispatched: []string{"a"}, Resolved: []string{"bc"}}).Canonical()
	if bytes.Equal(a, b) || bytes.Equal(b, c) || bytes.Equal(a, c) {
		t.Fatal("different id lists share bytes")
	}
}

func TestGenesisPin(t *testing.T) {
	in := append([]byte("sandbox.runrecord/1"), hx(t, "01*32 02*32")...)
	want := Address(blake3.Sum256(in))
	if got := Genesis(fill(1), fill(2)); got != want {
		t.Fatalf("Genesis = %s, want %s", got, want)
	}
	if Genesis(fill(1), fill(2)) == Genesis(fill(2), fill(1)) {
		t.Fatal("unit and grants are interchangeable in genesis")
	}
}

func TestChainPin(t *testing.T) {
	// head₁ = BLAKE3(head₀ ‖ 01 aa*32 00), built by hand.
	h0 := Genesis(fill(1), fill(2))
	want := Address(blake3.Sum256(append(h0[:], hx(t, "01 aa*32 00")...)))
	r := mustRecord(t)
	if got := mustAppend(t, r, Execution(fill(0xaa), nil)); got != want {
		t.Fatalf("head₁ = %s, want %s", got, want)
	}
}

func TestMalformedSnapshotRefusedBeforeHashing(t *testing.T) {
	for name, snap := range map[string]Snapshot{
		"neither":                 {},
		"both":                    {Root: ptr(fill(1)), Transcript: ptr(fill(2))},
		"transcript beside image": {Memory: ptr(fill(1)), Transcript: ptr(fill(2))},
		"all three":               {Root: ptr(fill(1)), Memory: ptr(fill(3)), Transcript: ptr(fill(2))},
		"memory without root":     {Memory: ptr(fill(1))},
	} {
		s := Suspension(snap, fill(9))
		out, err := s.AppendCanonical([]byte("keep"))
		if !errors.Is(err, ErrMalformedSnapshot) {
			t.Errorf("%s: err = %v, want ErrMalformedSnapshot", name, err)
		}
		if string(out) != "keep" {
			t.Errorf("%s: bytes written before refusal: %x", name, out)
		}
	}
}

func TestDecodeSegmentRejects(t *testing.T) {
	for name, in := range map[string]string{
		"empty":             "",
		"unknown kind":      "05",
		"truncated":         "01 aa*31",
		"trailing":          "01 aa*32 00 00",
		"bad marker":        "01 aa*32 02",
		"bad snapshot form": "02 03 bb*32 dd*32",
		"bad memory marker": "02 01 bb*32 07 dd*32",
		"bad provenance":    "03 02 ee*32 0000000000000001 03",
		"zero provenance":   "03 02 ee*32 0000000000000001 00",
		"huge id count":     "01 aa*32 01 ffffffff",
		"huge id length":    "01 aa*32 01 00000001 ffffffff",
		"empty id":          "01 aa*32 01 00000001 00000000 00000000",
		"huge reason":       "04 7fffffff",
		"invalid utf8":      "04 00000001 ff",
		"zero attestation":  "01 00*32 00",
	} {
		if _, err := DecodeSegment(hx(t, in)); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func TestStrayFieldsRefused(t *testing.T) {
	img := ImageSnapshot(fill(1), nil)
	for name, s := range map[string]Segment{
		"executed with snapshot": {Kind: Executed, Attestation: fill(1), Snapshot: img},
		"executed with reason":   {Kind: Executed, Attestation: fill(1), Reason: "x"},
		"suspended with idle":    {Kind: Suspended, Snapshot: img, Manifest: fill(2), IdleUJ: 1},
		"suspended no manifest":  {Kind: Suspended, Snapshot: img},
		"resumed with manifest":  {Kind: Resumed, Snapshot: img, Manifest: fill(2), Provenance: Measured},
		"resumed no provenance":  {Kind: Resumed, Snapshot: img},
		"closed with calls":      {Kind: Closed, Calls: &CallAccount{}},
		"unknown kind":           {Kind: 9},
	} {
		if err := s.Validate(); !errors.Is(err, ErrMalformedSegment) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// The worked example of docs/record-format.md, value for value.
func TestWorkedExample(t *testing.T) {
	r := mustRecord(t)
	if got := hexOf(r.Genesis().bytes()); got != "a51b79fe38fa84bdbdb64c647bf2958be4bbe3b7b3d19df9c258f3b86e99d95c" {
		t.Fatalf("head0 %s", got)
	}
	s1 := Execution(fill(0xaa), &CallAccount{Dispatched: []string{"b1"}})
	if c, _ := s1.Canonical(); !bytes.Equal(c, hx(t, "01 aa*32 01 00000001 00000002 6231 00000000")) {
		t.Fatalf("segment 1 bytes %x", c)
	}
	h1 := mustAppend(t, r, s1)
	if h1.String() != "b3:ODItP8DCpVIBrRHH4R9ikaWHGNO3ULJM-ixUEnfESo4" {
		t.Fatalf("head1 %s", h1)
	}
	h2 := mustAppend(t, r, Suspension(TranscriptSnapshot(fill(0xee)), fill(0xdd)))
	if hexOf(h2.bytes()) != "018f61d7e39a6ce4b5bc34ed8d2eeea18a3cad1ef225f3c10c7909667de2f1db" {
		t.Fatalf("head2 %s", h2)
	}
}

// The pins docs/record-format.md shows are the bytes the encoder writes:
// each line below must appear in the document as written, and decode (with
// "×" read as a repeat) to the segment's canonical bytes.
func TestDocumentPins(t *testing.T) {
	doc, err := os.ReadFile("../../docs/record-format.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		line string
		seg  Segment
	}{
		{"03 02 ee×32 0102030405060708 02", Resumption(TranscriptSnapshot(fill(0xee)), 0x0102030405060708, Estimated)},
		{"03 01 bb×32 00 0000000000000001 01", Resumption(ImageSnapshot(fill(0xbb), nil), 1, Measured)},
		{"`04 00000004 646f6e65`", Closure("done")},
		{"`04 00000000`", Closure("")},
		{"`04 00000005 c3a9 e280a8`", Closure("é\u2028")},
	} {
		if !bytes.Contains(doc, []byte(p.line)) {
			t.Errorf("docs/record-format.md does not show %q", p.line)
			continue
		}
		want := hx(t, strings.ReplaceAll(strings.Trim(p.line, "`"), "×", "*"))
		if got, err := p.seg.Canonical(); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: encoder writes %x (%v)", p.line, got, err)
		}
	}
	empty := New(fill(1), fill(2)).EncodeWire()
	if !bytes.Contains(doc, append([]byte("```\n"), empty...)) {
		t.Errorf("docs/record-format.md does not show the empty record's wire form %s", empty)
	}
}
