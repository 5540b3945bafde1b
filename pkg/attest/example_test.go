package attest

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// example is testdata/attestation/example.json: the inputs of
// docs/attestation.md's worked example and every value it shows. Hex is
// unbroken; addresses are in text form.
type example struct {
	Description string   `json:"description"`
	Seed        hexBytes `json:"seed"`
	UnitID      hexBytes `json:"unit_id"`
	GrantsID    hexBytes `json:"grants_id"`
	Receipt     struct {
		UJ         uint64            `json:"uj"`
		Provenance string            `json:"provenance"`
		Method     string            `json:"method"`
		CPUNS      uint64            `json:"cpu_ns"`
		WindowNS   uint64            `json:"window_ns"`
		Inputs     map[string]string `json:"inputs"`
	} `json:"receipt"`
	Journal []struct {
		Kind EntryKind `json:"kind"`
		AtNS int64     `json:"at_ns"`
		Data string    `json:"data"`
	} `json:"journal"`
	// Traffic is a traffic entry's inputs (docs/attestation.md, "Traffic
	// entries"): not in the example's journal, shown on its own.
	Traffic struct {
		AtNS       int64  `json:"at_ns"`
		InBytes    uint64 `json:"in_bytes"`
		InPackets  uint64 `json:"in_packets"`
		OutBytes   uint64 `json:"out_bytes"`
		OutPackets uint64 `json:"out_packets"`
		Reset      bool   `json:"reset"`
	} `json:"traffic"`
	Suspended hexBytes `json:"suspended"`
	Body      struct {
		Genesis  hexBytes `json:"genesis"`
		Interval uint64   `json:"interval"`
		PrevHead hexBytes `json:"prev_head"`
		StartNS  int64    `json:"start_ns"`
		EndNS    int64    `json:"end_ns"`
		Outcome  string   `json:"outcome"`
	} `json:"body"`
	Expect struct {
		PublicKey       hexBytes       `json:"public_key"`
		KeyID           record.Address `json:"key_id"`
		Receipt         hexBytes       `json:"receipt"`
		ReceiptAddress  record.Address `json:"receipt_address"`
		Journal         hexBytes       `json:"journal"`
		JournalRoot     record.Address `json:"journal_root"`
		Suspends        record.Address `json:"suspends"`
		Body            hexBytes       `json:"body"`
		BodyAddress     record.Address `json:"body_address"`
		SignatureInput  hexBytes       `json:"signature_input"`
		Signature       hexBytes       `json:"signature"`
		Envelope        hexBytes       `json:"envelope"`
		EnvelopeAddress record.Address `json:"envelope_address"`
		Executed        hexBytes       `json:"executed"`
		Head1           record.Address `json:"head1"`
		Head2           record.Address `json:"head2"`
		TrafficEntry    hexBytes       `json:"traffic_entry"`
	} `json:"expect"`
}

type hexBytes []byte

func (h *hexBytes) UnmarshalText(b []byte) error {
	v, err := hex.DecodeString(string(b))
	*h = v
	return err
}

func loadExample(tb testing.TB) *example {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "attestation", "example.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var ex example
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&ex); err != nil {
		tb.Fatalf("example.json: %v", err)
	}
	return &ex
}

func addrOf(t *testing.T, b []byte) record.Address {
	t.Helper()
	var a record.Address
	if len(b) != len(a) {
		t.Fatalf("%x: %d bytes, not an address", b, len(b))
	}
	copy(a[:], b)
	return a
}

// docDumps returns the bytes of each hex dump in the fenced blocks of a
// markdown document, one per block that has any. A dump line is hex (runs
// of it may be split by single spaces) up to two spaces or the line's end;
// what follows, and any other line, is commentary.
func docDumps(doc string) [][]byte {
	var (
		dumps [][]byte
		cur   []byte
		in    bool
	)
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			if in && cur != nil {
				dumps = append(dumps, cur)
			}
			in, cur = !in, nil
			continue
		}
		if !in {
			continue
		}
		col, _, _ := strings.Cut(line, "  ")
		b, err := hex.DecodeString(strings.ReplaceAll(col, " ", ""))
		if err != nil || len(b) == 0 || strings.ToLower(col) != col {
			continue
		}
		cur = append(cur, b...)
	}
	return dumps
}

// TestAttestationWorkedExample builds docs/attestation.md's worked example
// with this package and checks every value against
// testdata/attestation/example.json and against the document itself.
func TestAttestationWorkedExample(t *testing.T) {
	ex := loadExample(t)
	x := &ex.Expect
	same := func(what string, got, want []byte) {
		t.Helper()
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", what, got, want)
		}
	}
	sameAddr := func(what string, got, want record.Address) {
		t.Helper()
		if got != want {
			t.Errorf("%s: got %s, want %s", what, got, want)
		}
	}

	key := ed25519.NewKeyFromSeed(ex.Seed)
	pub := key.Public().(ed25519.PublicKey)
	same("public key", pub, x.PublicKey)
	sameAddr("key id", KeyID(pub), x.KeyID)

	prov := map[string]record.Provenance{"measured": record.Measured, "estimated": record.Estimated}[ex.Receipt.Provenance]
	rc, err := (&Receipt{UJ: ex.Receipt.UJ, Provenance: prov, Method: ex.Receipt.Method,
		CPUNS: ex.Receipt.CPUNS, WindowNS: ex.Receipt.WindowNS, Inputs: ex.Receipt.Inputs}).Canonical()
	if err != nil {
		t.Fatal(err)
	}
	same("receipt", rc, x.Receipt)
	sameAddr("receipt address", record.Sum(rc), x.ReceiptAddress)

	var j Journal
	for _, e := range ex.Journal {
		j.Add(e.Kind, e.AtNS, []byte(e.Data))
	}
	same("journal", j.Encode(), x.Journal)
	sameAddr("journal root", j.Root(), x.JournalRoot)
	tr := ex.Traffic
	te := Traffic{InBytes: tr.InBytes, InPackets: tr.InPackets, OutBytes: tr.OutBytes, OutPackets: tr.OutPackets, Reset: tr.Reset}.Entry(tr.AtNS)
	same("traffic entry", AppendEntry(nil, te.Kind, te.AtNS, te.Data), x.TrafficEntry)

	// The Suspended segment is docs/record-format.md's segment 2.
	susp := record.Suspension(record.TranscriptSnapshot(fill(0xee)), fill(0xdd))
	sc, err := susp.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	same("suspended segment", sc, ex.Suspended)
	sameAddr("suspends", record.Sum(sc), x.Suspends)

	rec := record.New(addrOf(t, ex.UnitID), addrOf(t, ex.GrantsID))
	sameAddr("genesis", rec.Genesis(), addrOf(t, ex.Body.Genesis))
	if ex.Body.Outcome != "parked" {
		t.Fatalf("outcome %q: the example parks", ex.Body.Outcome)
	}
	body := &Body{
		Genesis: addrOf(t, ex.Body.Genesis), Interval: ex.Body.Interval, PrevHead: addrOf(t, ex.Body.PrevHead),
		StartNS: ex.Body.StartNS, EndNS: ex.Body.EndNS, Receipt: record.Sum(rc), Journal: j.Root(),
		Outcome: Outcome{Kind: Parked, Suspends: record.Sum(sc)},
	}
	s, err := Sign(body, key)
	if err != nil {
		t.Fatal(err)
	}
	same("body", s.Body, x.Body)
	sameAddr("body address", record.Sum(s.Body), x.BodyAddress)
	same("signature input", signedMessage(s.Body), x.SignatureInput)
	same("signature", s.Signature, x.Signature)
	env := s.Encode()
	same("envelope", env, x.Envelope)
	sameAddr("envelope address", record.Sum(env), x.EnvelopeAddress)

	// The fixture's envelope opens, under a trust in its key alone, to the
	// example's body, and decodes and re-encodes to itself.
	trusted := func(k ed25519.PublicKey) bool { return k.Equal(pub) }
	back, err := Open(x.Envelope, trusted)
	if err != nil {
		t.Fatalf("open the example's envelope: %v", err)
	}
	if c, _ := back.Canonical(); !bytes.Equal(c, x.Body) {
		t.Errorf("opened body re-encodes to %x", c)
	}
	if d, err := DecodeSigned(x.Envelope); err != nil || !bytes.Equal(d.Encode(), x.Envelope) {
		t.Errorf("envelope does not round-trip: %v", err)
	}

	// In the record: segment 1 names the envelope, segment 2 is the
	// Suspended one, and the attestation stands at its place.
	exec := record.Execution(record.Sum(x.Envelope), nil)
	ec, _ := exec.Canonical()
	same("executed segment", ec, x.Executed)
	h1, err := rec.Append(exec)
	if err != nil {
		t.Fatal(err)
	}
	sameAddr("head1", h1, x.Head1)
	h2, err := rec.Append(susp)
	if err != nil {
		t.Fatal(err)
	}
	sameAddr("head2", h2, x.Head2)
	read := func(a record.Address) ([]byte, error) { return x.Envelope, nil }
	signers, err := CheckRecord(rec, read, func(k record.Address) bool { return k == x.KeyID })
	if err != nil || len(signers) != 1 || !signers[0].Trusted || signers[0].Interval != 1 {
		t.Errorf("CheckRecord: %+v %v", signers, err)
	}

	// The document shows the same: each of its dumps is one of these
	// objects, each object is one of its dumps, and every address is there
	// in hex and in text.
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "attestation.md"))
	if err != nil {
		t.Fatal(err)
	}
	re, err := resolutionExample.Entry(resolutionAtNS)
	if err != nil {
		t.Fatal(err)
	}
	ce, err := closedExample.Entry(closedAtNS)
	if err != nil {
		t.Fatal(err)
	}
	objects := map[string][]byte{
		"receipt": x.Receipt, "journal": x.Journal, "suspended segment": ex.Suspended, "body": x.Body,
		"signature input": x.SignatureInput, "envelope": x.Envelope, "executed segment": x.Executed,
		"traffic entry": x.TrafficEntry, "resolution entry": AppendEntry(nil, re.Kind, re.AtNS, re.Data),
		"closed entry": AppendEntry(nil, ce.Kind, ce.AtNS, ce.Data),
	}
	shown := map[string]bool{}
	for _, d := range docDumps(string(doc)) {
		found := false
		for name, b := range objects {
			if bytes.Equal(d, b) {
				shown[name], found = true, true
			}
		}
		if !found {
			t.Errorf("docs/attestation.md shows a dump that is none of the example's objects:\n%x", d)
		}
	}
	for name := range objects {
		if !shown[name] {
			t.Errorf("docs/attestation.md does not show the example's %s", name)
		}
	}
	for name, a := range map[string]record.Address{
		"genesis": rec.Genesis(), "key id": x.KeyID, "receipt address": x.ReceiptAddress, "journal root": x.JournalRoot,
		"suspends": x.Suspends, "body address": x.BodyAddress, "envelope address": x.EnvelopeAddress,
		"head1": x.Head1, "head2": x.Head2,
	} {
		if !bytes.Contains(doc, []byte(hex.EncodeToString(a[:]))) {
			t.Errorf("docs/attestation.md lacks the %s in hex, %x", name, a[:])
		}
		if name != "genesis" && !bytes.Contains(doc, []byte(a.String())) {
			t.Errorf("docs/attestation.md lacks the %s in text, %s", name, a)
		}
	}
	if !bytes.Contains(doc, []byte(hex.EncodeToString(x.PublicKey))) {
		t.Errorf("docs/attestation.md lacks the public key %x", x.PublicKey)
	}
}
