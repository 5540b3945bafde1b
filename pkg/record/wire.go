package record

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The wire form is JSON, addresses as "b3:" text. It states every head, and
// decoding recomputes them all: a segment edited after the fact fails
// verification at that segment rather than hashing to something new. The
// wire form is itself canonical — [DecodeWire] accepts exactly the bytes
// [Record.EncodeWire] writes — so one record has one wire form.

type wireRecord struct {
	Format   string        `json:"format"`
	Unit     Address       `json:"unit_id"`
	Grants   Address       `json:"grants_id"`
	Genesis  Address       `json:"genesis"`
	Segments []wireSegment `json:"segments"`
	Head     Address       `json:"head"`
}

type wireSegment struct {
	Kind        string        `json:"kind"`
	Attestation *Address      `json:"attestation,omitempty"`
	Calls       *wireCalls    `json:"calls,omitempty"`
	Snapshot    *wireSnapshot `json:"snapshot,omitempty"`
	Manifest    *Address      `json:"manifest,omitempty"`
	IdleUJ      *uint64       `json:"idle_uj,omitempty"`
	Provenance  string        `json:"provenance,omitempty"`
	Reason      *string       `json:"reason,omitempty"`
	Head        *Address      `json:"head,omitempty"`
}

type wireCalls struct {
	Dispatched *[]string `json:"dispatched"`
	Resolved   *[]string `json:"resolved"`
}

// wireRecordIn is what DecodeWire reads: each segment is decoded on its
// own, so a fault in one is reported with its index.
type wireRecordIn struct {
	Format   *string           `json:"format"`
	Unit     *Address          `json:"unit_id"`
	Grants   *Address          `json:"grants_id"`
	Genesis  *Address          `json:"genesis"`
	Segments []json.RawMessage `json:"segments"`
	Head     *Address          `json:"head"`
}

type wireSnapshot struct {
	Root       *Address `json:"root,omitempty"`
	Memory     *Address `json:"memory,omitempty"`
	Transcript *Address `json:"transcript,omitempty"`
}

func toWire(s *Segment) wireSegment {
	w := wireSegment{Kind: s.Kind.String()}
	switch s.Kind {
	case Executed:
		a := s.Attestation
		w.Attestation = &a
		if s.Calls != nil {
			d, r := nonNil(s.Calls.Dispatched), nonNil(s.Calls.Resolved)
			w.Calls = &wireCalls{Dispatched: &d, Resolved: &r}
		}
	case Suspended, Resumed:
		w.Snapshot = &wireSnapshot{Root: s.Snapshot.Root, Memory: s.Snapshot.Memory, Transcript: s.Snapshot.Transcript}
		if s.Kind == Suspended {
			m := s.Manifest
			w.Manifest = &m
		} else {
			idle := s.IdleUJ
			w.IdleUJ = &idle
			w.Provenance = s.Provenance.String()
		}
	case Closed:
		r := s.Reason
		w.Reason = &r
	}
	return w
}

func nonNil(ids []string) []string {
	if ids == nil {
		return []string{}
	}
	return ids
}

// fromWire reads a decoded wire segment. Every key of its kind must be
// present (a call account's two lists included: an empty list is [], never
// absent or null), so a vector or a wire form says each field it hashes;
// a key of another kind is read, and refused by [Segment.Validate] as a
// stray field.
func fromWire(w *wireSegment) (Segment, error) {
	var s Segment
	missing := func(key string) (Segment, error) {
		return Segment{}, fmt.Errorf("%w: %s segment without its %q key", ErrCanonical, w.Kind, key)
	}
	switch w.Kind {
	case "executed":
		s.Kind = Executed
		if w.Attestation == nil {
			return missing("attestation")
		}
	case "suspended":
		s.Kind = Suspended
		if w.Snapshot == nil {
			return missing("snapshot")
		}
		if w.Manifest == nil {
			return missing("manifest")
		}
	case "resumed":
		s.Kind = Resumed
		if w.Snapshot == nil {
			return missing("snapshot")
		}
		if w.IdleUJ == nil {
			return missing("idle_uj")
		}
		if w.Provenance == "" {
			return missing("provenance")
		}
	case "closed":
		s.Kind = Closed
		if w.Reason == nil {
			return missing("reason")
		}
	default:
		return s, fmt.Errorf("%w: unknown segment kind %q", ErrMalformedSegment, w.Kind)
	}
	if w.Attestation != nil {
		s.Attestation = *w.Attestation
	}
	if w.Calls != nil {
		if w.Calls.Dispatched == nil || w.Calls.Resolved == nil {
			return Segment{}, fmt.Errorf("%w: a call account states both lists, \"dispatched\" and \"resolved\" ([] when empty)", ErrCanonical)
		}
		s.Calls = &CallAccount{Dispatched: *w.Calls.Dispatched, Resolved: *w.Calls.Resolved}
	}
	if w.Snapshot != nil {
		s.Snapshot = Snapshot{Root: w.Snapshot.Root, Memory: w.Snapshot.Memory, Transcript: w.Snapshot.Transcript}
	}
	if w.Manifest != nil {
		s.Manifest = *w.Manifest
	}
	if w.IdleUJ != nil {
		s.IdleUJ = *w.IdleUJ
	}
	switch w.Provenance {
	case "":
	case "measured":
		s.Provenance = Measured
	case "estimated":
		s.Provenance = Estimated
	default:
		return s, fmt.Errorf("%w: unknown provenance %q", ErrMalformedSegment, w.Provenance)
	}
	if w.Reason != nil {
		s.Reason = *w.Reason
	}
	return s, nil
}

// MarshalJSON writes a segment's kind and the fields of its kind in the
// wire form, without a head. It does not validate, so a malformed snapshot
// can be written down (as the conformance vectors do) and refused later.
func (s Segment) MarshalJSON() ([]byte, error) {
	b, err := marshal(toWire(&s))
	return bytes.TrimSuffix(b, []byte("\n")), err
}

// UnmarshalJSON reads a segment's wire form. It checks the form's
// structure but not the segment's rules: a malformed snapshot decodes, and
// is refused by [Segment.Validate] or [Record.Append] before it is hashed.
func (s *Segment) UnmarshalJSON(b []byte) error {
	var w wireSegment
	if err := strictUnmarshal(b, &w); err != nil {
		return err
	}
	if w.Head != nil {
		return fmt.Errorf("%w: a lone segment carries no head", ErrMalformedSegment)
	}
	seg, err := fromWire(&w)
	if err != nil {
		return err
	}
	*s = seg
	return nil
}

// EncodeWire returns the record's wire form, ending in a newline.
func (r *Record) EncodeWire() []byte {
	w := wireRecord{
		Format:   Domain,
		Unit:     r.unit,
		Grants:   r.grants,
		Genesis:  r.genesis,
		Segments: make([]wireSegment, r.n),
		Head:     r.Head(),
	}
	for i := range r.n {
		w.Segments[i] = toWire(r.at(i))
		h := r.headAt(i)
		w.Segments[i].Head = &h
	}
	b, err := marshal(w)
	if err != nil {
		panic("record: encoding a verified record: " + err.Error())
	}
	return b
}

// DecodeWire parses a record's wire form and verifies it from genesis: the
// genesis head, every segment's phase rules and snapshot identity, and every
// stated head. A failure concerning one segment — bytes that do not decode
// as a segment, a refused append, a stated head that does not recompute, or
// a segment written other than EncodeWire writes it — is a [*SegmentError]
// naming it; bytes that verify but are not the canonical wire form wrap
// [ErrCanonical]. docs/record-format.md lists the checks in order.
func DecodeWire(b []byte) (*Record, error) {
	var w wireRecordIn
	if err := strictUnmarshal(b, &w); err != nil {
		return nil, err
	}
	for _, k := range []struct {
		key string
		ok  bool
	}{{"format", w.Format != nil}, {"unit_id", w.Unit != nil}, {"grants_id", w.Grants != nil},
		{"genesis", w.Genesis != nil}, {"segments", w.Segments != nil}, {"head", w.Head != nil}} {
		if !k.ok {
			return nil, fmt.Errorf("%w: the record has no %q key (or it is null)", ErrCanonical, k.key)
		}
	}
	if *w.Format != Domain {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrCanonical, *w.Format, Domain)
	}
	if err := checkIDs(*w.Unit, *w.Grants); err != nil {
		return nil, err
	}
	r := New(*w.Unit, *w.Grants)
	if *w.Genesis != r.genesis {
		return nil, fmt.Errorf("%w: stated genesis %s, recomputed %s", ErrHeadMismatch, *w.Genesis, r.genesis)
	}
	for i, raw := range w.Segments {
		var ws wireSegment
		if err := strictUnmarshal(raw, &ws); err != nil {
			return nil, &SegmentError{Index: i, Err: err}
		}
		seg, err := fromWire(&ws)
		if err != nil {
			return nil, &SegmentError{Index: i, Err: err}
		}
		h, err := r.Append(seg) // validates before hashing
		if err != nil {
			return nil, err
		}
		if ws.Head == nil || *ws.Head != h {
			return nil, &SegmentError{Index: i, Err: fmt.Errorf("%w: stated %v, recomputed %s", ErrHeadMismatch, ws.Head, h)}
		}
	}
	if *w.Head != r.Head() {
		return nil, fmt.Errorf("%w: stated record head %s, recomputed %s", ErrHeadMismatch, *w.Head, r.Head())
	}
	if !bytes.Equal(r.EncodeWire(), b) {
		// Name the first segment written otherwise, if one is.
		for i, raw := range w.Segments {
			ws := toWire(r.at(i))
			h := r.headAt(i)
			ws.Head = &h
			want, _ := marshal(ws)
			if !bytes.Equal(raw, bytes.TrimSuffix(want, []byte("\n"))) {
				return nil, &SegmentError{Index: i, Err: fmt.Errorf("%w: the segment verifies but is not written as EncodeWire writes it: %s", ErrCanonical, want)}
			}
		}
		return nil, fmt.Errorf("%w: the record verifies but its wire form is not the one written by EncodeWire", ErrCanonical)
	}
	return r, nil
}

func strictUnmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrCanonical, err)
	}
	if d.More() {
		return fmt.Errorf("%w: trailing data after the JSON value", ErrCanonical)
	}
	return nil
}

func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
