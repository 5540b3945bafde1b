package record

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
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

type wireSnapshot struct {
	Root       *Address `json:"root,omitempty"`
	Memory     *Address `json:"memory,omitempty"`
	Transcript *Address `json:"transcript,omitempty"`
}

// toWire writes s's kind and the fields of its kind, and any field of
// another kind that is set or that s's own wire form stated (a segment
// that never validates, as a vector may write down).
func toWire(s *Segment) wireSegment {
	w := wireSegment{Kind: s.Kind.String()}
	own := func(k Kind, bit strayKeys) bool { return s.Kind == k || s.stray&bit != 0 }
	parks := s.Kind == Suspended || s.Kind == Resumed
	if own(Executed, strayAttestation) || !s.Attestation.IsZero() {
		a := s.Attestation
		w.Attestation = &a
	}
	if s.Calls != nil {
		d, r := nonNil(s.Calls.Dispatched), nonNil(s.Calls.Resolved)
		w.Calls = &wireCalls{Dispatched: &d, Resolved: &r}
	}
	if parks || s.stray&straySnapshot != 0 || !s.Snapshot.isEmpty() {
		w.Snapshot = &wireSnapshot{Root: s.Snapshot.Root, Memory: s.Snapshot.Memory, Transcript: s.Snapshot.Transcript}
	}
	if own(Suspended, strayManifest) || !s.Manifest.IsZero() {
		m := s.Manifest
		w.Manifest = &m
	}
	if own(Resumed, strayIdleUJ) || s.IdleUJ != 0 {
		idle := s.IdleUJ
		w.IdleUJ = &idle
	}
	if own(Resumed, strayProvenance) || s.Provenance != 0 {
		w.Provenance = s.Provenance.String()
	}
	if own(Closed, strayReason) || s.Reason != "" {
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

// Keys of the wire form, and the segment kinds each belongs to.
var (
	recordKeys   = []string{"format", "unit_id", "grants_id", "genesis", "segments", "head"}
	snapshotKeys = []string{"root", "memory", "transcript"}
	callsKeys    = []string{"dispatched", "resolved"}
	segmentKeys  = []string{"kind", "attestation", "calls", "snapshot", "manifest", "idle_uj", "provenance", "reason", "head"}
	// keyKinds: the kinds a key belongs to, and the stray bit it sets
	// on a segment of another kind.
	keyKinds = map[string]struct {
		kinds []Kind
		bit   strayKeys
	}{
		"attestation": {[]Kind{Executed}, strayAttestation},
		"calls":       {[]Kind{Executed}, strayCalls},
		"snapshot":    {[]Kind{Suspended, Resumed}, straySnapshot},
		"manifest":    {[]Kind{Suspended}, strayManifest},
		"idle_uj":     {[]Kind{Resumed}, strayIdleUJ},
		"provenance":  {[]Kind{Resumed}, strayProvenance},
		"reason":      {[]Kind{Closed}, strayReason},
	}
	kindKeys = map[Kind][]string{
		Executed:  {"attestation"},
		Suspended: {"snapshot", "manifest"},
		Resumed:   {"snapshot", "idle_uj", "provenance"},
		Closed:    {"reason"},
	}
)

// members reads one JSON object, keeping what encoding/json would let by:
// a key twice, a key other than keys (compared exactly, where encoding/json
// folds case), and a null value are all [ErrCanonical].
func members(b []byte, what string, keys []string) (map[string]json.RawMessage, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("%w: %s is not a JSON object", ErrCanonical, what)
	}
	out := map[string]json.RawMessage{}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrCanonical, what, err)
		}
		k, _ := t.(string)
		if !slices.Contains(keys, k) {
			return nil, fmt.Errorf("%w: %s has an unknown key %q", ErrCanonical, what, k)
		}
		if _, twice := out[k]; twice {
			return nil, fmt.Errorf("%w: %s has the key %q twice", ErrCanonical, what, k)
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrCanonical, what, err)
		}
		if string(v) == "null" {
			return nil, fmt.Errorf("%w: %s has %q null", ErrCanonical, what, k)
		}
		out[k] = v
	}
	if _, err := d.Token(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCanonical, what, err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after %s", ErrCanonical, what)
	}
	return out, nil
}

// value decodes the member key of m, if present, into v.
func value(m map[string]json.RawMessage, key string, v any) (bool, error) {
	raw, ok := m[key]
	if !ok {
		return false, nil
	}
	if err := strictUnmarshal(raw, v); err != nil {
		return true, fmt.Errorf("%w: %q", err, key)
	}
	return true, nil
}

// decodeSegment reads a segment's wire form: its keys exactly (see
// [members]), its kind known, every key of its kind present (a call
// account's two lists included: an empty list is [], never absent), and a
// provenance known. A key of another kind is kept as a stray key whatever
// its value, and refused by [Segment.Validate] in its place among the
// stray fields. head is the segment's stated head when withHead.
func decodeSegment(b []byte, withHead bool) (s Segment, head *Address, err error) {
	m, err := members(b, "a segment", segmentKeys)
	if err != nil {
		return Segment{}, nil, err
	}
	var kind string
	if ok, err := value(m, "kind", &kind); !ok || err != nil {
		return Segment{}, nil, cmp.Or(err, fmt.Errorf("%w: a segment without its \"kind\" key", ErrCanonical))
	}
	switch kind {
	case "executed":
		s.Kind = Executed
	case "suspended":
		s.Kind = Suspended
	case "resumed":
		s.Kind = Resumed
	case "closed":
		s.Kind = Closed
	default:
		return Segment{}, nil, fmt.Errorf("%w: unknown segment kind %q", ErrMalformedSegment, kind)
	}
	for _, k := range kindKeys[s.Kind] {
		if _, ok := m[k]; !ok {
			return Segment{}, nil, fmt.Errorf("%w: %s segment without its %q key", ErrCanonical, kind, k)
		}
	}
	for k := range m {
		if kk, ok := keyKinds[k]; ok && !slices.Contains(kk.kinds, s.Kind) {
			s.stray |= kk.bit
		}
	}
	if err := decodeFields(m, &s); err != nil {
		return Segment{}, nil, err
	}
	if _, ok := m["head"]; ok && !withHead {
		return Segment{}, nil, fmt.Errorf("%w: a lone segment carries no head", ErrMalformedSegment)
	}
	if withHead {
		head = new(Address)
		if ok, err := value(m, "head", head); !ok || err != nil {
			return Segment{}, nil, cmp.Or(err, fmt.Errorf("%w: a segment of a record without its \"head\" key", ErrCanonical))
		}
	}
	return s, head, nil
}

// decodeFields decodes the members of m other than kind and head into s.
func decodeFields(m map[string]json.RawMessage, s *Segment) error {
	if _, err := value(m, "attestation", &s.Attestation); err != nil {
		return err
	}
	if raw, ok := m["calls"]; ok {
		c, err := members(raw, "a call account", callsKeys)
		if err != nil {
			return err
		}
		s.Calls = &CallAccount{}
		ok1, err1 := value(c, "dispatched", &s.Calls.Dispatched)
		ok2, err2 := value(c, "resolved", &s.Calls.Resolved)
		if err := cmp.Or(err1, err2); err != nil {
			return err
		}
		if !ok1 || !ok2 {
			return fmt.Errorf("%w: a call account states both lists, \"dispatched\" and \"resolved\" ([] when empty)", ErrCanonical)
		}
	}
	if raw, ok := m["snapshot"]; ok {
		sm, err := members(raw, "a snapshot", snapshotKeys)
		if err != nil {
			return err
		}
		for _, f := range []struct {
			key string
			p   **Address
		}{{"root", &s.Snapshot.Root}, {"memory", &s.Snapshot.Memory}, {"transcript", &s.Snapshot.Transcript}} {
			var a Address
			if ok, err := value(sm, f.key, &a); err != nil {
				return err
			} else if ok {
				*f.p = &a
			}
		}
	}
	if _, err := value(m, "manifest", &s.Manifest); err != nil {
		return err
	}
	if _, err := value(m, "idle_uj", &s.IdleUJ); err != nil {
		return err
	}
	var prov string
	if ok, err := value(m, "provenance", &prov); err != nil {
		return err
	} else if ok {
		switch prov {
		case "measured":
			s.Provenance = Measured
		case "estimated":
			s.Provenance = Estimated
		default:
			return fmt.Errorf("%w: unknown provenance %q", ErrMalformedSegment, prov)
		}
	}
	_, err := value(m, "reason", &s.Reason)
	return err
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
	seg, _, err := decodeSegment(b, false)
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
	m, err := members(b, "the record", recordKeys)
	if err != nil {
		return nil, err
	}
	for _, k := range recordKeys {
		if _, ok := m[k]; !ok {
			return nil, fmt.Errorf("%w: the record has no %q key", ErrCanonical, k)
		}
	}
	var (
		format                        string
		unit, grants, genesis, stated Address
		segs                          []json.RawMessage
	)
	for _, f := range []struct {
		key string
		v   any
	}{{"format", &format}, {"unit_id", &unit}, {"grants_id", &grants}, {"genesis", &genesis}, {"segments", &segs}, {"head", &stated}} {
		if _, err := value(m, f.key, f.v); err != nil {
			return nil, err
		}
	}
	if format != Domain {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrCanonical, format, Domain)
	}
	if err := checkIDs(unit, grants); err != nil {
		return nil, err
	}
	r := New(unit, grants)
	if genesis != r.genesis {
		return nil, fmt.Errorf("%w: stated genesis %s, recomputed %s", ErrHeadMismatch, genesis, r.genesis)
	}
	for i, raw := range segs {
		seg, head, err := decodeSegment(raw, true)
		if err != nil {
			return nil, &SegmentError{Index: i, Err: err}
		}
		h, err := r.Append(seg) // validates before hashing
		if err != nil {
			return nil, err
		}
		if *head != h {
			return nil, &SegmentError{Index: i, Err: fmt.Errorf("%w: stated %s, recomputed %s", ErrHeadMismatch, *head, h)}
		}
	}
	if stated != r.Head() {
		return nil, fmt.Errorf("%w: stated record head %s, recomputed %s", ErrHeadMismatch, stated, r.Head())
	}
	if !bytes.Equal(r.EncodeWire(), b) {
		// Name the first segment written otherwise, if one is.
		for i, raw := range segs {
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

// strictUnmarshal decodes one JSON value into v. Its refusal is
// [ErrCanonical] alone: an address's text that does not parse is the wire
// form not written canonically, and is not also [ErrAddress], so that one
// refusal has one name.
func strictUnmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrCanonical, err)
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
