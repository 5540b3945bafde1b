package attest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"sort"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Receipt is an interval's energy receipt (§6): microjoules with their
// provenance, the method that produced them, and the inputs.
type Receipt struct {
	UJ         uint64
	Provenance record.Provenance
	Method     string            // e.g. "rapl-share" or "cpu-time-coefficient"
	CPUNS      uint64            // the sandbox's CPU time over the interval
	WindowNS   uint64            // the interval's wall time
	Inputs     map[string]string // further inputs, by name (coefficients, zones, fallback reasons)
}

// Canonical returns the receipt's canonical bytes: the domain, uj (8),
// provenance (1), method (4-byte length ‖ bytes), cpu ns (8), window ns
// (8), input count (4), then inputs sorted by name, each as two
// length-prefixed strings.
func (r *Receipt) Canonical() ([]byte, error) {
	if r.Provenance != record.Measured && r.Provenance != record.Estimated {
		return nil, fmt.Errorf("%w: receipt with %s", ErrMalformed, r.Provenance)
	}
	out := append([]byte(ReceiptDomain), 0, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint64(out[len(ReceiptDomain):], r.UJ)
	out = append(out, byte(r.Provenance))
	out = appendStr(out, r.Method)
	out = binary.BigEndian.AppendUint64(out, r.CPUNS)
	out = binary.BigEndian.AppendUint64(out, r.WindowNS)
	names := make([]string, 0, len(r.Inputs))
	for k := range r.Inputs {
		names = append(names, k)
	}
	sort.Strings(names)
	out = binary.BigEndian.AppendUint32(out, uint32(len(names)))
	for _, k := range names {
		out = appendStr(out, k)
		out = appendStr(out, r.Inputs[k])
	}
	return out, nil
}

// DecodeReceipt parses canonical receipt bytes.
func DecodeReceipt(p []byte) (*Receipt, error) {
	rd := reader{p: p}
	if string(rd.take(len(ReceiptDomain))) != ReceiptDomain {
		return nil, fmt.Errorf("%w: not a receipt", ErrMalformed)
	}
	r := &Receipt{UJ: rd.u64(), Provenance: record.Provenance(rd.byte1())}
	r.Method = rd.str()
	r.CPUNS = rd.u64()
	r.WindowNS = rd.u64()
	n := rd.u32()
	if uint64(n) > uint64(len(rd.p))/8 {
		rd.bad = true
	}
	for range n {
		if rd.bad {
			break
		}
		if r.Inputs == nil {
			r.Inputs = map[string]string{}
		}
		k := rd.str()
		r.Inputs[k] = rd.str()
	}
	if rd.bad || len(rd.p) != 0 {
		return nil, fmt.Errorf("%w: receipt truncated or with trailing bytes", ErrMalformed)
	}
	again, err := r.Canonical()
	if err != nil {
		return nil, err
	}
	if string(again) != string(p) {
		return nil, fmt.Errorf("%w: receipt not canonical", ErrMalformed)
	}
	return r, nil
}

// EntryKind classifies a replay-journal entry.
type EntryKind uint8

// Journal entry kinds.
const (
	Stdout     EntryKind = 1
	Stderr     EntryKind = 2
	Lifecycle  EntryKind = 3 // started, checkpointed, restored, exited …
	Transcript EntryKind = 4 // an append to the unit's transcript
	Dispatch   EntryKind = 5 // an outward call dispatched
	Result     EntryKind = 6 // a call's result delivered
	// TrafficKind is the run's traffic through its egress link in the
	// interval (Traffic).
	TrafficKind EntryKind = 7
	// ResolutionKind is an answer the run's resolver gave it for a name
	// its egress grant lists (Resolution).
	ResolutionKind EntryKind = 8
	// ClosedKind is the run's connections to outside a resume closed
	// (Closed).
	ClosedKind EntryKind = 9
)

// checkEntry refuses the data of an entry of kind k that its kind's
// format does not allow, and an unknown kind.
func checkEntry(k EntryKind, d []byte) error {
	switch {
	case k < Stdout || k > ClosedKind:
		return fmt.Errorf("%w: journal entry kind %d", ErrMalformed, k)
	case k == TrafficKind:
		_, err := DecodeTraffic(d)
		return err
	case k == ResolutionKind:
		_, err := DecodeResolution(d)
		return err
	case k == ClosedKind:
		_, err := DecodeClosed(d)
		return err
	}
	return nil
}

// Entry is one replay-journal entry.
type Entry struct {
	Kind EntryKind
	AtNS int64
	Data []byte
}

// Journal is an interval's ordered replay journal (§8).
type Journal struct{ Entries []Entry }

// Add appends an entry.
func (j *Journal) Add(kind EntryKind, atNS int64, data []byte) {
	j.Entries = append(j.Entries, Entry{Kind: kind, AtNS: atNS, Data: append([]byte(nil), data...)})
}

// Encode returns the journal object: the domain, the entry count (4), then
// each entry as kind (1), time (8) and length-prefixed data. Its root is
// the BLAKE3 of these bytes — the object's own address.
func (j *Journal) Encode() []byte {
	n := len(JournalDomain) + 4
	for _, e := range j.Entries {
		n += 13 + len(e.Data)
	}
	out := make([]byte, 0, n)
	out = append(out, JournalDomain...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(j.Entries)))
	for _, e := range j.Entries {
		out = AppendEntry(out, e.Kind, e.AtNS, e.Data)
	}
	return out
}

// AppendEntry appends one entry in a journal object's form: kind (1),
// time (8), length-prefixed data.
func AppendEntry(out []byte, kind EntryKind, atNS int64, data []byte) []byte {
	out = append(out, byte(kind))
	out = binary.BigEndian.AppendUint64(out, uint64(atNS))
	out = binary.BigEndian.AppendUint32(out, uint32(len(data)))
	return append(out, data...)
}

// EncodeEntries is entries as a journal object encodes them, without the
// journal's domain and count.
func EncodeEntries(es []Entry) []byte {
	var out []byte
	for _, e := range es {
		out = AppendEntry(out, e.Kind, e.AtNS, e.Data)
	}
	return out
}

// JournalReader streams a journal object of n entries: the domain, the
// count, then parts, each a run of encoded entries, in order — the bytes
// Encode makes of the same entries, never all in memory.
func JournalReader(n int, parts ...io.Reader) io.Reader {
	head := binary.BigEndian.AppendUint32([]byte(JournalDomain), uint32(n))
	return io.MultiReader(append([]io.Reader{bytes.NewReader(head)}, parts...)...)
}

// Root returns the journal's root.
func (j *Journal) Root() record.Address { return record.Sum(j.Encode()) }

// DecodeJournal parses a journal object.
func DecodeJournal(p []byte) (*Journal, error) {
	rd := reader{p: p}
	if string(rd.take(len(JournalDomain))) != JournalDomain {
		return nil, fmt.Errorf("%w: not a journal", ErrMalformed)
	}
	n := rd.u32()
	if uint64(n) > uint64(len(rd.p))/13 {
		return nil, fmt.Errorf("%w: journal entry count %d too large", ErrMalformed, n)
	}
	j := &Journal{Entries: make([]Entry, 0, n)}
	for range n {
		k := EntryKind(rd.byte1())
		at := int64(rd.u64())
		d := []byte(rd.str())
		if checkEntry(k, d) != nil {
			rd.bad = true
		}
		if rd.bad {
			break
		}
		j.Entries = append(j.Entries, Entry{Kind: k, AtNS: at, Data: d})
	}
	if rd.bad || len(rd.p) != 0 {
		return nil, fmt.Errorf("%w: journal truncated or with trailing bytes", ErrMalformed)
	}
	return j, nil
}

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
