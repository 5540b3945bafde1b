// Package calls is the daemon's room for a transcript unit's outward calls:
// the [Channel] behind the unit's socket (the protocol.Handler that keeps
// the interval's transcript, journal spool and call account), and what the
// platform does with calls — [Post] a result, [List] the calls awaiting
// results, [Awaiting] the results a parked run still waits for. It does not
// import the daemon: what it needs is the [Store] (internal/store's) and a
// [Daemon] to announce dispatches and park on an await.
//
// # The ledger is the one home of call state
//
// Every call lives in the store's call ledger (internal/store, "The call
// ledger"): the interval that dispatched it, its kind, the object holding
// its dispatch (the call's JSON: the bytes of its journal entry), its state
// (outstanding, posted, resolved), the object holding its posted result,
// and whether the run's last await names it. A dispatch is written to the
// ledger when the unit makes it; a result when the platform posts it; a
// delivery when the unit reads it; the await when the unit awaits. The
// store folds each recorded interval's account into the ledger in the
// record's own transaction, so the record and the ledger never disagree:
// calls of an interval that is not recorded (its channel died with a
// daemon) leave the ledger with it, and a closed run's ledger goes with
// the close.
//
// The replay journal still receives every entry it did — dispatches,
// results, the await, transcript appends — with the same bytes: it is the
// evidence, written and never read back to find call state. It is read in
// two cases only, both to fill the ledger in once ([Fill]): a run whose
// record was written elsewhere (imported, or extended by a bundle), and a
// run of a state directory from a daemon before the ledger ([Upgrade],
// which also brings that daemon's results/RUN files into the ledger).
//
// # Limits
//
// The channel holds to the run's limits (docs/limits.md) as before: the
// transcript's size, the interval's appended and dispatched bytes (with
// the call objects of calls still outstanding from earlier intervals,
// counted when the channel opens), the calls one interval dispatches and
// the calls outstanding at once. A refused request changes nothing: no
// byte appended, no entry spooled, no ledger write.
package calls
