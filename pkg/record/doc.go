// Package record is the run record: segments, their canonical bytes, the
// BLAKE3 hash chain over them, verification from genesis, the wire form,
// and the wait proof over call accounts.
//
// The package is pure: it does no I/O, reads no clock and keeps no globals,
// so an auditor can vendor it alone. Byte layouts are specified in
// docs/record-format.md and pinned by tests against hand-written bytes.
//
// # The chain
//
//	head₀ = BLAKE3("sandbox.runrecord/1" ‖ unit_id ‖ grants_id)
//	headₙ = BLAKE3(headₙ₋₁ ‖ canonical(segmentₙ))
//
// [Genesis] computes head₀; a [Chain] advances a [State] by one segment;
// a [Record] keeps the segments and the head after each.
//
// # Phases
//
// A run starts executing. Executed and Suspended segments are allowed only
// while executing, and a Suspended one only right after an Executed one (a
// park ends an interval); Resumed only while parked, only with the snapshot
// that was suspended ([Snapshot.Equal]), and only while the idle total
// stays within 64 bits; Closed from any phase; nothing after Closed. No
// field holds the zero address, and no id appears twice in one call list.
// A refused segment is a [*SegmentError] naming the index it would have
// taken, wrapping [ErrParked], [ErrNotParked], [ErrClosed],
// [ErrAlternation], [ErrSnapshotMismatch], [ErrOverflow],
// [ErrMalformedSnapshot] or [ErrMalformedSegment], and leaves the record
// as it was. docs/record-format.md lists the checks in the order they run.
//
// # Snapshots
//
// A [Snapshot] names exactly one form: image (filesystem root, optional
// memory image) or transcript (transcript address only). Neither, both, or
// a transcript beside a memory image is refused by [Snapshot.Validate]
// before any byte is hashed. An image and a transcript over the same inner
// address are different parks.
//
// # Wire form
//
// [Record.EncodeWire] writes JSON stating every head; [DecodeWire]
// recomputes them all and accepts only the bytes EncodeWire would write, so
// an edited record fails verification at the edited segment.
//
// # Wait proof
//
// [Proof] walks the Executed segments holding the calls outstanding at each
// one's start and returns a [Verdict]: NonBlocking, Blocked, Malformed or
// Unproved. An absent [CallAccount] (nil) and an empty one encode to
// different bytes.
package record
