// Package store keeps a host's run records and sealed objects: records in
// one bbolt file, objects as content-addressed files beside it. Nothing in
// it is lost, half-written or silently corrupted: every record append is
// one bbolt transaction, fsynced; every object is written temp → fsync →
// rename → fsync of the directory; every read across a trust boundary is
// checked against the address.
//
// # Layout on disk
//
//	DIR/
//	  records.db            bbolt, the schema below
//	  objects/
//	    tmp/                objects being written (removed on open)
//	    <aa>/<address>      one file per object, <aa> the address's first
//	                        two characters after "b3:", <address> the other 43
//
// # bbolt schema (version 2)
//
//	meta/
//	  version  → uint32 schema version, big-endian
//	runs/
//	  <run id>/                       one bucket per run
//	    state  → run state: see encodeState
//	    segs/
//	      <index, uint64 BE> → head after the segment (32) ‖ canonical segment
//	phases/                           the phase index (version 2)
//	  executing/ <run id> → ""
//	  parked/    <run id> → ""
//	  closed/    <run id> → ""
//	refs/
//	  <object address (32)> → addresses (32 each) the object refers to
//
// A run's state holds its unit and grants ids, head, length and phase, so
// [Store.Head] is one lookup and [Store.Runs] by phase reads the index, never
// the segments. Objects an object refers to (an attestation's receipt and
// journal, a directory's files) are declared when it is put, in refs/, so
// garbage collection walks from the records through them.
//
// # Migrations
//
// [migrations] is the ordered list; migration i takes a store from version
// i to i+1. Version 1 had no phase index; migration 1 builds it from the
// run states.
//
// # Guarantees and caveats
//
//   - [Store.Append] validates with pkg/record before writing, and refuses,
//     with nothing written, a stale expected head ([ErrHeadMoved]) and a
//     segment naming an object the store does not hold ([ErrMissingObject]).
//     Objects are durable before the segment naming them, so a crash never
//     leaves a segment pointing at nothing.
//   - Concurrent appends share commits (group commit) but each is judged
//     alone: one writer's refusal never affects another's append.
//   - Local reads ([Store.Path]) are not verified; [Store.Open],
//     [Store.Verify] and [Store.VerifyDir] are, and report [ErrCorrupt]
//     naming the address.
package store
