package attest

import (
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// ErrPlace is an attestation that does not stand where the record puts
// it: it names another run's genesis, another interval ordinal, another
// head it continues from, or (a park) another Suspended segment; or a
// Suspended segment no park attestation seals. Such a record was spliced.
var ErrPlace = errors.New("attestation does not belong at its place in the record")

// ErrUntrusted is an attestation signed by a key the host does not trust.
var ErrUntrusted = errors.New("attestation signed by an untrusted host key")

// PlaceError says which field of the attestation at segment Index differs
// from its place in the record.
type PlaceError struct {
	Index     int    // the segment (0-based)
	Field     string // "genesis", "interval", "previous head", "suspended segment"
	Want, Got string
}

func (e *PlaceError) Error() string {
	return fmt.Sprintf("segment %d: %v: %s: the record needs %s, the attestation names %s", e.Index, ErrPlace, e.Field, e.Want, e.Got)
}

func (e *PlaceError) Unwrap() error { return ErrPlace }

// UntrustedError names the key of an attestation the host does not trust.
type UntrustedError struct {
	Index int            // the segment (0-based)
	Key   record.Address // the signer's key id
}

func (e *UntrustedError) Error() string {
	return fmt.Sprintf("segment %d: %v %s (trust it with `runrecordd trust add %s` if that host is yours)", e.Index, ErrUntrusted, e.Key, e.Key)
}

func (e *UntrustedError) Unwrap() error { return ErrUntrusted }

// Signer is the signer of one attestation of a record.
type Signer struct {
	Index    int            // the Executed segment (0-based)
	Interval uint64         // its ordinal among the run's executed intervals
	Key      record.Address // the signer's key id
	Trusted  bool
}

// CheckRecord opens every attestation a record names and checks that each
// stands at its place: it names the run's genesis, its interval ordinal
// (the first Executed segment is 1), the head before its segment, and, for
// a park, the canonical bytes of the Suspended segment right after it.
// Every Suspended segment must be sealed so. read returns an object's
// bytes; trusted says whether a key id is trusted (nil: none is).
//
// It returns the signer of every attestation it opened. A record that
// does not hold together is an error; an untrusted signer is not (the
// Signer says so), except through [Untrusted].
func CheckRecord(rec *record.Record, read func(record.Address) ([]byte, error), trusted func(record.Address) bool) ([]Signer, error) {
	var (
		signers  []Signer
		interval uint64
		sealed   = -1 // the index of the Suspended segment the last park sealed
	)
	genesis := rec.Genesis()
	for i := range rec.Len() {
		s := rec.Segment(i)
		switch s.Kind {
		case record.Suspended:
			if sealed != i {
				return signers, &PlaceError{Index: i, Field: "suspended segment", Want: "a park attestation right before it", Got: "none"}
			}
			continue
		case record.Executed:
		default:
			continue
		}
		interval++
		b, err := read(s.Attestation)
		if err != nil {
			return signers, fmt.Errorf("segment %d: attestation %s: %w", i, s.Attestation, err)
		}
		body, err := Open(b, nil)
		if err != nil {
			return signers, &record.SegmentError{Index: i, Err: fmt.Errorf("attestation %s: %w", s.Attestation, err)}
		}
		sg := Signer{Index: i, Interval: body.Interval, Key: body.HostKey}
		sg.Trusted = trusted != nil && trusted(body.HostKey)
		signers = append(signers, sg)
		prev := genesis
		if i > 0 {
			prev = rec.HeadAt(i - 1)
		}
		switch {
		case body.Genesis != genesis:
			return signers, &PlaceError{Index: i, Field: "genesis", Want: genesis.String(), Got: body.Genesis.String()}
		case body.Interval != interval:
			return signers, &PlaceError{Index: i, Field: "interval", Want: fmt.Sprint(interval), Got: fmt.Sprint(body.Interval)}
		case body.PrevHead != prev:
			return signers, &PlaceError{Index: i, Field: "previous head", Want: prev.String(), Got: body.PrevHead.String()}
		}
		if body.Outcome.Kind != Parked {
			continue
		}
		want := "none (the record ends)"
		if i+1 < rec.Len() {
			next := rec.Segment(i + 1)
			if next.Kind == record.Suspended {
				c, err := next.Canonical()
				if err != nil {
					return signers, &record.SegmentError{Index: i + 1, Err: err}
				}
				if a := record.Sum(c); a == body.Outcome.Suspends {
					sealed = i + 1
					continue
				} else {
					want = a.String()
				}
			} else {
				want = "none (a " + next.Kind.String() + " segment follows)"
			}
		}
		return signers, &PlaceError{Index: i, Field: "suspended segment", Want: want, Got: body.Outcome.Suspends.String()}
	}
	return signers, nil
}

// Untrusted returns an [*UntrustedError] for the first signer not trusted,
// or nil.
func Untrusted(signers []Signer) error {
	for _, s := range signers {
		if !s.Trusted {
			return &UntrustedError{Index: s.Index, Key: s.Key}
		}
	}
	return nil
}
