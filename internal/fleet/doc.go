// Package fleet is the run directory of a fleet of runrecordd hosts, kept
// in etcd: which keys are admitted, which hosts are alive, and which host
// owns each run, at which head. It is the one place that says a run lives
// on one host: a host appends to a run only while the directory says it
// owns it, and every head advance is an etcd transaction that compares the
// head before it, so no two hosts ever resume the same run.
//
// # Key layout
//
// Under a prefix ([DefaultPrefix], "/runrecordd/"); key ids and geneses
// are record addresses in their text form (b3:…); values are JSON objects
// with a format "v": 1, decoded strictly (docs/fleet.md has every field):
//
//	PREFIX/hosts/KEYID   admitted key: {"v","name","role","admitted"}; role host or platform
//	PREFIX/alive/KEYID   a host's live session: its name, attached to its lease
//	PREFIX/runs/GENESIS  a run's entry: {"v","run","owner","lease","head","phase",
//	                     "prev","prev_phase","to"}
//
// # Ownership
//
// A host joins ([Dir.Join]) with a lease that it keeps alive; its alive
// key lives and dies with the lease. A run's entry names its owner's key
// and the lease under which it was claimed; the owner owns the run while
// that lease lives. Every write of an entry ([Session.Claim],
// [Session.Advance], [Session.Revert], [Session.Transfer], [Session.Remove]) is one
// transaction comparing the entry's revision as read, the writer's own
// alive key's lease, and, for a takeover, the old owner's alive key's
// lease: a write judged on a state that changed before it commits is not
// applied. A run whose owner's lease is gone is an orphan ([Dir.Orphans]),
// which another host may claim; a run the owner transferred
// ([Session.Transfer]) may be claimed by the host it names, and its owner may
// no longer advance it.
//
// The writes, each refused with nothing written unless its rule holds:
//
//   - Claim (genesis, run, head, phase): no entry; one this session owns;
//     one of an orphan or whose "to" names this host. Head and phase must
//     be the entry's, or its prev for the same key (a later session): it
//     creates the entry, leaves it, or takes it over (at prev: taking back
//     an advance never appended). Else [ErrNotOwner] (also the loser of
//     two concurrent claims) or [ErrHeadMoved].
//   - Advance (genesis, prev, next, phase): the owning session, no
//     transfer pending, from the entry's head; the old head becomes prev.
//   - Revert: the owner puts head back to prev.
//   - Transfer (genesis, to): the owner of a parked run, to an admitted
//     host; a transfer to itself takes back one not yet claimed
//     ([ErrNotParked], [ErrNotAdmitted]).
//   - Remove: the owner, the entry still at its genesis.
//
// A write whose inputs changed before it committed is judged again, at
// most 8 times.
//
// Safety over liveness: a host that cannot get etcd's confirmation gets
// [ErrUnavailable] and must not act; a host whose lease is lost gets
// [ErrLeaseLost] (with [ErrNotOwner]) from then on, and must stop its runs
// by [Session.ValidUntil]. The ordering of an advance and the bbolt append,
// and what a crash between them leaves, are in docs/fleet.md.
package fleet
