package record

import (
	"errors"
	"fmt"
)

// Errors returned by this package. A refusal of a segment is a
// [*SegmentError] wrapping one of these, so callers test with errors.Is and
// read the segment index with errors.As.
var (
	// ErrAddress: text that is not an address's one text form
	// ([ParseAddress]), or a zero unit or grant-set id. Inside a wire form
	// a malformed address is [ErrCanonical] alone.
	ErrAddress = errors.New("malformed address")
	// ErrMalformedSnapshot: a snapshot reference naming neither form, both,
	// or a transcript beside a memory image. Refused before hashing.
	ErrMalformedSnapshot = errors.New("malformed snapshot reference")
	// ErrMalformedSegment: a segment whose fields do not fit its kind.
	ErrMalformedSegment = errors.New("malformed segment")
	// ErrSnapshotMismatch: a Resumed segment whose snapshot is not the one
	// recorded at suspension.
	ErrSnapshotMismatch = errors.New("snapshot mismatch")
	// ErrParked: an Executed or Suspended segment while the run is parked.
	ErrParked = errors.New("run is parked")
	// ErrNotParked: a Resumed segment while the run is not parked.
	ErrNotParked = errors.New("run is not parked")
	// ErrClosed: any segment after Closed.
	ErrClosed = errors.New("run is closed")
	// ErrAlternation: a Suspended segment that does not follow an
	// Executed one (a park ends an interval).
	ErrAlternation = errors.New("phases do not alternate")
	// ErrOverflow: a Resumed segment whose idle energy would take the
	// record's idle total past 2⁶⁴−1 µJ.
	ErrOverflow = errors.New("idle energy total overflows")
	// ErrHeadMismatch: a stated head that the chain does not recompute to.
	ErrHeadMismatch = errors.New("head does not recompute")
	// ErrCanonical: bytes that are not the canonical encoding of a segment,
	// or a wire form that is not the one this package writes.
	ErrCanonical = errors.New("not canonical")
	// ErrReceipt: a Totals call missing an attested receipt, or one whose
	// sum overflows.
	ErrReceipt = errors.New("receipt")
)

// SegmentError is a refusal that concerns one segment. Index is the
// segment's 0-based position in the record (for a refused append, the
// position it would have taken).
type SegmentError struct {
	Index int
	Err   error
}

func (e *SegmentError) Error() string { return fmt.Sprintf("segment %d: %v", e.Index, e.Err) }

func (e *SegmentError) Unwrap() error { return e.Err }
