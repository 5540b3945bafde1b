package record

import (
	"fmt"
	"unicode/utf8"
)

// Kind is a segment's kind; its value is the segment's first canonical byte.
type Kind uint8

// The four segment kinds.
const (
	Executed  Kind = 0x01 // one active interval, by its attestation's address
	Suspended Kind = 0x02 // the run parked: snapshot reference and manifest
	Resumed   Kind = 0x03 // the run un-parked: snapshot restored and idle energy
	Closed    Kind = 0x04 // the run ended, from any phase
)

func (k Kind) String() string {
	switch k {
	case Executed:
		return "executed"
	case Suspended:
		return "suspended"
	case Resumed:
		return "resumed"
	case Closed:
		return "closed"
	}
	return fmt.Sprintf("kind(0x%02x)", uint8(k))
}

// Provenance labels an energy figure: measured by the host, or estimated.
type Provenance uint8

// The two provenances; the value is the canonical byte.
const (
	Measured  Provenance = 0x01
	Estimated Provenance = 0x02
)

func (p Provenance) String() string {
	switch p {
	case Measured:
		return "measured"
	case Estimated:
		return "estimated"
	}
	return fmt.Sprintf("provenance(0x%02x)", uint8(p))
}

// Limits on variable-length fields. They keep a record's canonical bytes
// bounded and its wire form printable.
const (
	MaxCallIDLen = 256  // bytes in one call id
	MaxCalls     = 4096 // ids in one dispatched or resolved list
	MaxReasonLen = 4096 // bytes in a Closed segment's reason
)

// CallAccount lists, in order, the calls an interval dispatched and the
// results it resolved, by call id. An interval with a nil *CallAccount did
// not account; one with an empty CallAccount accounted for no calls. The
// two hash differently.
type CallAccount struct {
	Dispatched []string
	Resolved   []string
}

// Segment is one entry of a run record. Only the fields of its Kind may be
// set; the rest stay zero (a segment with a stray field is refused with
// [ErrMalformedSegment], so a segment has one canonical encoding).
type Segment struct {
	Kind Kind

	// Executed.
	Attestation Address
	Calls       *CallAccount

	// Suspended and Resumed.
	Snapshot Snapshot
	// Suspended.
	Manifest Address

	// Resumed.
	IdleUJ     uint64
	Provenance Provenance

	// Closed.
	Reason string

	// stray marks the keys of other kinds a segment's wire form stated,
	// whatever their values: each is a stray field, even "reason":"".
	stray strayKeys
}

// strayKeys is a set of wire-form keys a segment's kind does not have.
type strayKeys uint8

const (
	strayAttestation strayKeys = 1 << iota
	strayCalls
	straySnapshot
	strayManifest
	strayIdleUJ
	strayProvenance
	strayReason
)

// Execution returns an Executed segment. calls may be nil (not accounted).
func Execution(attestation Address, calls *CallAccount) Segment {
	return Segment{Kind: Executed, Attestation: attestation, Calls: calls}
}

// Suspension returns a Suspended segment.
func Suspension(snap Snapshot, manifest Address) Segment {
	return Segment{Kind: Suspended, Snapshot: snap, Manifest: manifest}
}

// Resumption returns a Resumed segment.
func Resumption(snap Snapshot, idleUJ uint64, prov Provenance) Segment {
	return Segment{Kind: Resumed, Snapshot: snap, IdleUJ: idleUJ, Provenance: prov}
}

// Closure returns a Closed segment.
func Closure(reason string) Segment {
	return Segment{Kind: Closed, Reason: reason}
}

// Validate reports whether s is well formed on its own, without reference
// to a record: its kind is known, its snapshot (Suspended and Resumed)
// names exactly one form over non-zero addresses, its own fields are set
// and within limits, and no other kind's field is set. The checks run in
// that order; the first that fails is the error.
func (s Segment) Validate() error { return s.validate() }

func (s *Segment) validate() error {
	malformed := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s segment %s", ErrMalformedSegment, s.Kind, fmt.Sprintf(format, args...))
	}
	// 1. The kind.
	switch s.Kind {
	case Executed, Suspended, Resumed, Closed:
	default:
		return fmt.Errorf("%w: unknown %s", ErrMalformedSegment, s.Kind)
	}
	// 2. The snapshot reference of a park or a resume.
	parks := s.Kind == Suspended || s.Kind == Resumed
	if parks {
		if err := s.Snapshot.Validate(); err != nil {
			return err
		}
	}
	// 3. The kind's own fields.
	switch s.Kind {
	case Executed:
		if s.Attestation.IsZero() {
			return malformed("without attestation (the zero address names nothing)")
		}
		if s.Calls != nil {
			if err := s.Calls.validate(); err != nil {
				return err
			}
		}
	case Suspended:
		if s.Manifest.IsZero() {
			return malformed("without manifest (the zero address names nothing)")
		}
	case Resumed:
		if s.Provenance != Measured && s.Provenance != Estimated {
			return malformed("with %s", s.Provenance)
		}
		// A parked interval retained something: its idle energy is
		// owed, image park or transcript park, and is never zero.
		if s.IdleUJ == 0 {
			return malformed("with idle_uj 0: a park's idle energy is never zero")
		}
	case Closed:
		if len(s.Reason) > MaxReasonLen || !utf8.ValidString(s.Reason) {
			return malformed("reason must be UTF-8 of at most %d bytes", MaxReasonLen)
		}
	}
	// 4. Fields of other kinds, in this order: set, or stated by the
	// wire form whatever their values.
	stray := func(name string) error { return malformed("with %s set", name) }
	switch {
	case s.Kind != Executed && (!s.Attestation.IsZero() || s.stray&strayAttestation != 0):
		return stray("attestation")
	case s.Kind != Executed && (s.Calls != nil || s.stray&strayCalls != 0):
		return stray("call account")
	case !parks && (!s.Snapshot.isEmpty() || s.stray&straySnapshot != 0):
		return stray("snapshot")
	case s.Kind != Suspended && (!s.Manifest.IsZero() || s.stray&strayManifest != 0):
		return stray("manifest")
	case s.Kind != Resumed && (s.IdleUJ != 0 || s.Provenance != 0 || s.stray&(strayIdleUJ|strayProvenance) != 0):
		return stray("idle energy")
	case s.Kind != Closed && (s.Reason != "" || s.stray&strayReason != 0):
		return stray("reason")
	}
	return nil
}

// validate refuses an id list over the limits, an id that is empty, too
// long or not UTF-8, and an id twice in one list: a list names each call
// once (an id in both lists, or in two segments, is the wait proof's to
// judge).
func (c *CallAccount) validate() error {
	for _, list := range [2][]string{c.Dispatched, c.Resolved} {
		if len(list) > MaxCalls {
			return fmt.Errorf("%w: %d call ids in one list, limit %d", ErrMalformedSegment, len(list), MaxCalls)
		}
		for _, id := range list {
			if id == "" || len(id) > MaxCallIDLen || !utf8.ValidString(id) {
				return fmt.Errorf("%w: call id %q: must be 1 to %d bytes of UTF-8", ErrMalformedSegment, id, MaxCallIDLen)
			}
		}
		if id, ok := duplicate(list); ok {
			return fmt.Errorf("%w: call id %q twice in one list", ErrMalformedSegment, id)
		}
	}
	return nil
}

// duplicate returns an id that list holds twice. Short lists, the usual
// kind, are compared pairwise without allocating.
func duplicate(list []string) (string, bool) {
	if len(list) <= 16 {
		for i := 1; i < len(list); i++ {
			for _, prev := range list[:i] {
				if list[i] == prev {
					return list[i], true
				}
			}
		}
		return "", false
	}
	seen := make(map[string]struct{}, len(list))
	for _, id := range list {
		if _, ok := seen[id]; ok {
			return id, true
		}
		seen[id] = struct{}{}
	}
	return "", false
}

// Snapshot is a snapshot reference: what a park retained, in exactly one of
// two forms. The image form sets Root and optionally Memory; the transcript
// form sets Transcript alone.
type Snapshot struct {
	Root       *Address // image form: filesystem root
	Memory     *Address // image form, optional: memory image
	Transcript *Address // transcript form: the transcript
}

// ImageSnapshot returns an image-form reference. memory may be nil.
func ImageSnapshot(root Address, memory *Address) Snapshot {
	return Snapshot{Root: &root, Memory: memory}
}

// TranscriptSnapshot returns a transcript-form reference.
func TranscriptSnapshot(transcript Address) Snapshot {
	return Snapshot{Transcript: &transcript}
}

func (s Snapshot) isEmpty() bool { return s.Root == nil && s.Memory == nil && s.Transcript == nil }

// IsTranscript reports whether s is in transcript form.
func (s Snapshot) IsTranscript() bool { return s.Transcript != nil && s.Root == nil && s.Memory == nil }

// Validate refuses, with [ErrMalformedSnapshot], a reference naming neither
// form, both forms, or a transcript beside a memory image, and one naming
// the zero address (which names no object).
func (s Snapshot) Validate() error {
	for _, a := range [3]*Address{s.Root, s.Memory, s.Transcript} {
		if a != nil && a.IsZero() {
			return fmt.Errorf("%w: the zero address names no object", ErrMalformedSnapshot)
		}
	}
	switch {
	case s.Transcript != nil && s.Memory != nil:
		return fmt.Errorf("%w: a transcript beside a memory image", ErrMalformedSnapshot)
	case s.Transcript != nil && s.Root != nil:
		return fmt.Errorf("%w: both an image and a transcript", ErrMalformedSnapshot)
	case s.Transcript == nil && s.Root == nil:
		if s.Memory != nil {
			return fmt.Errorf("%w: a memory image without a filesystem root", ErrMalformedSnapshot)
		}
		return fmt.Errorf("%w: neither an image nor a transcript", ErrMalformedSnapshot)
	}
	return nil
}

// Equal reports whether s and o are the same park: the same form over the
// same addresses. An image and a transcript over one inner address differ.
func (s Snapshot) Equal(o Snapshot) bool {
	return eqAddr(s.Root, o.Root) && eqAddr(s.Memory, o.Memory) && eqAddr(s.Transcript, o.Transcript)
}

func eqAddr(a, b *Address) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// Addresses returns the object addresses s refers to.
func (s Snapshot) Addresses() []Address {
	var out []Address
	for _, p := range []*Address{s.Root, s.Memory, s.Transcript} {
		if p != nil {
			out = append(out, *p)
		}
	}
	return out
}

func (s Snapshot) String() string {
	switch {
	case s.IsTranscript():
		return "transcript " + s.Transcript.String()
	case s.Root != nil && s.Transcript == nil && s.Memory == nil:
		return "image root " + s.Root.String()
	case s.Root != nil && s.Transcript == nil:
		return "image root " + s.Root.String() + " memory " + s.Memory.String()
	}
	return "malformed snapshot"
}
