// Package store keeps a host's run records and sealed objects: records in
// one bbolt file, objects as content-addressed files beside it. Nothing in
// it is lost, half-written or silently corrupted: a record append is one
// fsynced bbolt transaction; an object is written temp → fsync → rename →
// fsync of the directory; a read across a trust boundary is checked
// against the address. docs/store.md records the decisions behind it.
//
// # Layout on disk
//
//	DIR/
//	  records.db          bbolt, the schema below
//	  objects/
//	    tmp/              puts and staging in progress (emptied on open)
//	    <c>/<text>        one read-only file per object: <text> is the
//	                      address's text without "b3:", <c> its first
//	                      character (64 shard directories)
//
// # bbolt schema (version 7)
//
//	meta/
//	  version          → uint32, big-endian: the schema version
//	runs/
//	  <run id>         → run state: format 2 ‖ unit id (32) ‖ grants id (32)
//	                     ‖ head (32) ‖ segment count (8) ‖ phase (1)
//	                     ‖ last segment's log sequence number (8)
//	                     ‖ last segment's kind (1, 0 if none)
//	                     ‖ idle-energy total, µJ (8) (version 5)
//	log/               (sequence: the last sequence number given out)
//	  <seq, uint64 BE> → one segment: run id length (1) ‖ run id
//	                     ‖ index in the run (8) ‖ previous segment's seq (8,
//	                     0 for the first) ‖ head after it (32)
//	                     ‖ canonical segment bytes
//	phases/            the phase index (version 2)
//	  executing/
//	    <run id>       → empty
//	  parked/
//	    <run id>       → empty
//	  closed/
//	    <run id>       → empty
//	refs/
//	  <address (32)>   → the addresses (32 each) that object declared it refers to
//	geneses/           (version 3) one timeline per run
//	  <head₀ (32)>     → the id of the run with that genesis
//	handoffs/
//	  <run id>         → the head (32) an export handed the run off at
//	closed/
//	  <run id>         → when the store saw the run closed (Unix ns, 8)
//	pins/
//	  <run id>         → empty: retention keeps its snapshots
//	released/
//	  <run id>         → when its image snapshots were released (Unix ns, 8)
//	imported/
//	  <run id>         → when its record last arrived in a bundle (Unix ns, 8)
//	roots/
//	  <address (32)>   → empty: kept whatever the records reach
//	trust/             the host keys this daemon trusts (version 4)
//	  <key id (32)>    → the name it was given (UTF-8, at most 256 bytes)
//	calls/             the call ledger (version 6): one bucket per run not closed
//	  <run id>/
//	    run            → format 1 ‖ executed intervals on the record (8)
//	                     ‖ the interval whose await the flags name (8; 0 none)
//	                     ‖ entries touched in the open interval (4)
//	    ids/
//	      <call id>    → format 1 ‖ state (1: 1 outstanding, 2 posted,
//	                     3 resolved) ‖ flags (1: bit 0 awaited)
//	                     ‖ dispatched in (8) ‖ resolved in (8; 0 unless resolved)
//	                     ‖ call object (32; zero while not known)
//	                     ‖ result object (32; zero unless posted, or
//	                     resolved in the open interval)
//	                     ‖ kind length (2) ‖ kind (at most 256 bytes)
//	owed/              post-copy (version 7): what a run stored lacks
//	  <run id>         → format 1 ‖ source key id (32) ‖ head (32) ‖ slab count
//	                     (4) ‖ slabs (32 each) ‖ listing count (4) ‖ listings (32 each)
//	holds/             the runs a source serves until their targets hold them
//	  <run id>         → format 1 ‖ target key id (32) ‖ head (32) ‖ since (Unix ns, 8)
//	stranded/          owings whose source can serve them no more (made by the
//	                   first [Store.Strand]; schema 7 without it is the same)
//	  <run id>         → format 1 ‖ the owing's head (32) ‖ since (Unix ns, 8)
//	                     ‖ reason (UTF-8, at most 1 KiB)
//
// A run's state (123 bytes) makes [Store.Head] and [Store.Run] O(1) and lets
// [Store.Append] judge a segment without reading the record (a parked
// run's snapshot is its last segment's, one lookup away). Segments of all
// runs share one log in commit order, so a commit of many runs' appends
// writes a handful of pages, not one per run; a run's segments are linked
// back from its state. [Store.Runs] reads the phase index, never the
// segments. Reading a record recomputes the state's last kind and idle
// total; a state that disagrees is [ErrDamaged].
//
// # Migrations
//
// [SchemaVersion] is the current version. A new store is created at
// version 1 (meta, runs, log, refs) and brought up through the ordered
// migration list, so every migration runs on every store. Migration 1→2
// builds the phase index from the run states; 2→3 indexes runs by genesis
// and creates the retention buckets; 3→4 creates the (empty) trust
// bucket; 4→5 rewrites every run state in format 2, reading each run's
// log for its last kind and idle total (one past 2⁶⁴−1 is kept at 2⁶⁴−1,
// so the run's next resume is refused, not the store's opening); 5→6 creates the call ledger and
// folds every open run's record into its ledger. A store from a newer
// schema is refused with [ErrSchema].
//
// # The call ledger
//
// The ledger is the one home of a run's outward calls (calls.go): a call
// dispatched in the open interval ([Store.Dispatched]), its result posted
// ([Store.Post]) and delivered ([Store.Resolve]), the unit's await
// ([Store.Await]). Every transaction that appends segments folds them into
// the run's ledger (ledgerfold.go): an Executed segment's account confirms
// what the open interval dispatched and delivered, or undoes what it does
// not name (an unaccounted interval drops its calls), and a Closed
// segment removes the ledger. So the calls the ledger has on the record
// are always exactly those the record's accounts dispatched, resolved as
// they say.
//
// # Guarantees
//
//   - [Store.Append] is one transaction: it refuses, with nothing written,
//     a stale expected head ([ErrHeadMoved]), a segment pkg/record refuses,
//     and a segment naming an object the store does not hold
//     ([ErrMissingObject]). Objects are durable before the segment that
//     names them, so a crash never leaves a segment naming nothing.
//     [Store.AppendAll] appends several segments in one such transaction:
//     all of them, or, on any refusal, none.
//   - Concurrent writers share commits (group commit); each is judged
//     alone, and one's refusal never disturbs another's append.
//   - [Store.Record] and [Store.Check] verify every record from genesis;
//     [Store.Raw] only decodes, for callers that verify in their own order.
//     [Store.Open], [Store.ReadAll], [Store.Verify], [Store.Listing] and
//     [Store.Materialize] verify object bytes, reporting a [*CorruptError]
//     that names the address. [Store.Rehash] and [Store.RehashDir] answer
//     what the stored bytes hash to now, without failing because they
//     changed. [Store.Path] is the unverified local path.
//     [Store.Adopt] hashes a staged file and renames it into place, durably
//     as Put writes, without a second copy.
//   - Objects a record reaches — its run's unit and grants ids when stored
//     as objects, named by a segment, or through the refs an object
//     declared when put (an attestation's receipt and journal, a
//     directory's files) — are never collected by [Store.GC].
//   - A run's call ledger is written in the transactions of its record:
//     no crash leaves the two disagreeing. [Store.Check] verifies every
//     ledger against its record, and [Store.GC] keeps the objects a ledger
//     names (call objects, posted results) as it keeps a record's.
//   - A damaged bbolt file or objects directory is an error wrapping
//     [ErrDamaged], never a panic: bbolt's panics and faults on damaged
//     pages are recovered.
//
// # Where the code is
//
// One concept per file. Records: runs.go (a run's state and summary,
// [Store.Create]), append.go ([Store.Append]'s checks and writes, in
// order), record.go (reading a record back, verified or [Store.Raw]),
// import.go (a record received whole), handoff.go (one timeline per run),
// retention.go, trust.go. Objects: objects.go ([Store.Put] and the durable
// naming of an object), adopt.go, refs.go (declared refs), reader.go
// (verified reads), copy.go (the pooled buffers every stream goes
// through), rehash.go, gc.go. Directory objects: listing.go (the listing's
// bytes and rules), ingest.go (a staged tree in), hashed.go (hashes a
// follower vouches for), dir.go (a listing out: [Store.VerifyDir],
// [Store.Materialize]), parallel.go (the one worker pool). The ledger:
// calls.go, ledger.go, ledgerfold.go, ledgercheck.go. The database:
// store.go, commit.go (group commit), schema.go (this tree and the
// migrations), check.go.
//
// # Contexts
//
// Calls bounded by one commit (Create, Append, AppendAll, Import, PutBytes)
// take no context: an append abandoned while its commit went through would
// report a failure that did not happen. Calls that stream or walk an
// unbounded amount (Put, Adopt, Ingest, Verify, VerifyDir, Rehash,
// RehashDir, Materialize, Check, GC) take one.
package store
