// Package interval is the daemon's room for an open interval: the span in
// which a run's unit executes between two segments of its record. An
// [Interval] holds where the span began (its [Mark]: time, output offsets,
// the meter's CPU reading, the lifecycle entries so far) and what meters
// it; [Interval.End] is the one place an interval ends.
//
// A [Recorder] is this host's side of every interval: where a run keeps its
// output and its saved mark (StateDir/runs/<id>/stdout, stderr,
// interval.json), the meter ([IdleMeter] over internal/idle), and the store and
// [Signer] an interval ends into. The daemon begins, reattaches, saves,
// drops and ends its runs' intervals through it; a mark not saved, or an
// interval not metered, is a warning in its log, not a failure.
//
// # Ending an interval
//
// End, in this order:
//
//  1. ends the metering (a meter that cannot say is an estimated receipt,
//     labelled with why);
//  2. seals the receipt and the replay journal — the lifecycle entries, the
//     channel's spooled entries, the unit's output since the mark, and what
//     the caller adds — as durable objects;
//  3. signs the attestation, under the [Signer]'s lock, naming the host's
//     previous attestation (audit_prev), stores it, keeps it as a root, and
//     advances the host's audit head, durably;
//  4. appends the Executed segment and the caller's segments after it (a
//     park's Suspended, a close's Closed) in one transaction at the head the
//     attestation continues from;
//  5. drops the saved mark.
//
// A failure in 1–3 records nothing: objects may be left, unreferenced, for
// the store's collector. A refusal in 4 records nothing either; the audit
// head has advanced past an attestation no segment names, which is allowed
// (it is a root, so the next attestation's audit_prev resolves). In both
// cases the metering is over: the caller that keeps the unit running opens
// a new interval ([Interval.Ended] says so). A crash anywhere leaves the
// record as it was or with the whole interval: never half of one.
package interval
