// Package attest is the sealed evidence behind an Executed segment: the
// interval's attestation (signed by the host), its energy receipt and its
// replay journal. Each is an object with canonical bytes; docs/attestation.md
// gives the layouts.
//
// An Executed segment points at a signed attestation: the envelope holding
// the attestation body, the host's ed25519 public key and its signature
// over SignatureDomain ‖ the body's address. The body binds the run's
// genesis head, the interval number, the record head it continues from,
// the host key id, the interval's start and end, the receipt and journal
// addresses, the outcome and, optionally, the host's previous attestation
// (audit_prev).
package attest

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Domains of the canonical forms.
const (
	BodyDomain      = "runrecordd.attestation/1"
	EnvelopeDomain  = "runrecordd.signed-attestation/1"
	SignatureDomain = "runrecordd.attestation-signature/1"
	ReceiptDomain   = "runrecordd.receipt/1"
	JournalDomain   = "runrecordd.journal/1"
)

// Errors.
var (
	ErrMalformed = errors.New("malformed evidence")
	ErrSignature = errors.New("attestation signature does not verify")
)

// OutcomeKind is how an interval ended.
type OutcomeKind uint8

// Outcomes.
const (
	Running OutcomeKind = 1 // still running (a checkpoint taken, say)
	Parked  OutcomeKind = 2 // the interval ended in a park
	Exited  OutcomeKind = 3 // the unit exited, with Code
	Killed  OutcomeKind = 4 // the unit was killed
)

func (k OutcomeKind) String() string {
	switch k {
	case Running:
		return "running"
	case Parked:
		return "parked"
	case Exited:
		return "exited"
	case Killed:
		return "killed"
	}
	return fmt.Sprintf("outcome(%d)", uint8(k))
}

// Outcome is an interval's outcome. Code is meaningful for Exited only;
// Suspends for Parked only, where it is required: the address of the
// canonical bytes of the Suspended segment the park appends after the
// Executed one (its snapshot and manifest). The signature thereby covers
// the record's tail, which no later attestation's PrevHead reaches.
type Outcome struct {
	Kind     OutcomeKind
	Code     int32
	Suspends record.Address
}

// Body is an attestation's content.
type Body struct {
	Genesis   record.Address  // the run's head₀
	Interval  uint64          // 1 for a run's first executed interval
	PrevHead  record.Address  // the record head this interval continues from
	HostKey   record.Address  // BLAKE3 of the host's ed25519 public key
	StartNS   int64           // interval start, Unix nanoseconds
	EndNS     int64           // interval end
	Receipt   record.Address  // energy receipt object
	Journal   record.Address  // replay journal object (its root)
	Outcome   Outcome         //
	AuditPrev *record.Address // the host's previous attestation, if any
}

// Canonical returns the body's canonical bytes.
func (b *Body) Canonical() ([]byte, error) {
	switch b.Outcome.Kind {
	case Running, Parked, Killed:
		if b.Outcome.Code != 0 {
			return nil, fmt.Errorf("%w: exit code on a %s outcome", ErrMalformed, b.Outcome.Kind)
		}
	case Exited:
	default:
		return nil, fmt.Errorf("%w: %s", ErrMalformed, b.Outcome.Kind)
	}
	switch {
	case b.Outcome.Kind == Parked && b.Outcome.Suspends.IsZero():
		return nil, fmt.Errorf("%w: a parked outcome must name its Suspended segment", ErrMalformed)
	case b.Outcome.Kind != Parked && !b.Outcome.Suspends.IsZero():
		return nil, fmt.Errorf("%w: a %s outcome names a Suspended segment", ErrMalformed, b.Outcome.Kind)
	}
	if b.EndNS < b.StartNS {
		return nil, fmt.Errorf("%w: interval ends before it starts", ErrMalformed)
	}
	out := make([]byte, 0, 256)
	out = append(out, BodyDomain...)
	out = append(out, b.Genesis[:]...)
	out = binary.BigEndian.AppendUint64(out, b.Interval)
	out = append(out, b.PrevHead[:]...)
	out = append(out, b.HostKey[:]...)
	out = binary.BigEndian.AppendUint64(out, uint64(b.StartNS))
	out = binary.BigEndian.AppendUint64(out, uint64(b.EndNS))
	out = append(out, b.Receipt[:]...)
	out = append(out, b.Journal[:]...)
	out = append(out, byte(b.Outcome.Kind))
	switch b.Outcome.Kind {
	case Exited:
		out = binary.BigEndian.AppendUint32(out, uint32(b.Outcome.Code))
	case Parked:
		out = append(out, b.Outcome.Suspends[:]...)
	}
	if b.AuditPrev == nil {
		return append(out, 0), nil
	}
	out = append(out, 1)
	return append(out, b.AuditPrev[:]...), nil
}

// DecodeBody parses canonical body bytes, accepting only what Canonical
// writes.
func DecodeBody(p []byte) (*Body, error) {
	r := reader{p: p}
	if string(r.take(len(BodyDomain))) != BodyDomain {
		return nil, fmt.Errorf("%w: not an attestation body", ErrMalformed)
	}
	b := &Body{}
	b.Genesis = r.addr()
	b.Interval = r.u64()
	b.PrevHead = r.addr()
	b.HostKey = r.addr()
	b.StartNS = int64(r.u64())
	b.EndNS = int64(r.u64())
	b.Receipt = r.addr()
	b.Journal = r.addr()
	b.Outcome.Kind = OutcomeKind(r.byte1())
	switch b.Outcome.Kind {
	case Exited:
		b.Outcome.Code = int32(r.u32())
	case Parked:
		b.Outcome.Suspends = r.addr()
	}
	switch r.byte1() {
	case 0:
	case 1:
		a := r.addr()
		b.AuditPrev = &a
	default:
		r.bad = true
	}
	if r.bad || len(r.p) != 0 {
		return nil, fmt.Errorf("%w: attestation body truncated or with trailing bytes", ErrMalformed)
	}
	if _, err := b.Canonical(); err != nil {
		return nil, err
	}
	return b, nil
}

// Signed is an attestation envelope: the body's canonical bytes, the
// host's public key and the signature.
type Signed struct {
	Body      []byte
	PublicKey ed25519.PublicKey
	Signature []byte
}

// KeyID returns the id of a public key: the BLAKE3 of its 32 bytes.
func KeyID(pub ed25519.PublicKey) record.Address { return record.Sum(pub) }

// signedMessage is what the host key signs: SignatureDomain ‖ BLAKE3(body).
func signedMessage(body []byte) []byte {
	a := record.Sum(body)
	return append([]byte(SignatureDomain), a[:]...)
}

// Sign seals body with the host key; body.HostKey is set to the key's id.
func Sign(body *Body, key ed25519.PrivateKey) (*Signed, error) {
	pub := key.Public().(ed25519.PublicKey)
	body.HostKey = KeyID(pub)
	cb, err := body.Canonical()
	if err != nil {
		return nil, err
	}
	return &Signed{Body: cb, PublicKey: pub, Signature: ed25519.Sign(key, signedMessage(cb))}, nil
}

// Encode returns the envelope's bytes: the object an Executed segment names.
func (s *Signed) Encode() []byte {
	out := make([]byte, 0, len(EnvelopeDomain)+4+len(s.Body)+32+64)
	out = append(out, EnvelopeDomain...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(s.Body)))
	out = append(out, s.Body...)
	out = append(out, s.PublicKey...)
	return append(out, s.Signature...)
}

// DecodeSigned parses an envelope without verifying it, accepting only
// what Encode writes: the domain, a body length that spans exactly the
// bytes before the key and signature, and a body DecodeBody accepts. The
// Signed's fields share p's memory.
func DecodeSigned(p []byte) (*Signed, error) {
	s, _, err := decodeSigned(p)
	return s, err
}

func decodeSigned(p []byte) (*Signed, *Body, error) {
	r := reader{p: p}
	if string(r.take(len(EnvelopeDomain))) != EnvelopeDomain {
		return nil, nil, fmt.Errorf("%w: not a signed attestation", ErrMalformed)
	}
	n := r.u32()
	body := r.take(int(n))
	pub := ed25519.PublicKey(r.take(ed25519.PublicKeySize))
	sig := r.take(ed25519.SignatureSize)
	if r.bad || len(r.p) != 0 {
		return nil, nil, fmt.Errorf("%w: signed attestation truncated or with trailing bytes", ErrMalformed)
	}
	b, err := DecodeBody(body)
	if err != nil {
		return nil, nil, err
	}
	return &Signed{Body: body, PublicKey: pub, Signature: sig}, b, nil
}

// Open parses an envelope and verifies it: the body decodes, its host key
// id is the envelope's key, and the signature verifies. trusted, if not
// nil, must also accept the key. It returns the body.
func Open(p []byte, trusted func(ed25519.PublicKey) bool) (*Body, error) {
	s, b, err := decodeSigned(p)
	if err != nil {
		return nil, err
	}
	if b.HostKey != KeyID(s.PublicKey) {
		return nil, fmt.Errorf("%w: body names host key %s, envelope carries %s", ErrSignature, b.HostKey, KeyID(s.PublicKey))
	}
	if !ed25519.Verify(s.PublicKey, signedMessage(s.Body), s.Signature) {
		return nil, ErrSignature
	}
	if trusted != nil && !trusted(s.PublicKey) {
		return nil, fmt.Errorf("%w: host key %s is not trusted", ErrSignature, KeyID(s.PublicKey))
	}
	return b, nil
}

// Refs returns the objects an attestation body refers to.
func (b *Body) Refs() []record.Address {
	refs := []record.Address{b.Receipt, b.Journal}
	if b.AuditPrev != nil {
		refs = append(refs, *b.AuditPrev)
	}
	return refs
}

type reader struct {
	p   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n < 0 || len(r.p) < n {
		r.bad = true
		return nil
	}
	v := r.p[:n]
	r.p = r.p[n:]
	return v
}

func (r *reader) byte1() byte {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (r *reader) addr() record.Address {
	var a record.Address
	copy(a[:], r.take(32))
	return a
}

func (r *reader) str() string {
	n := r.u32()
	if uint64(n) > uint64(len(r.p)) {
		r.bad = true
		return ""
	}
	return string(r.take(int(n)))
}
