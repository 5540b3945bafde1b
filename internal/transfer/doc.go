// Package transfer moves a run's objects between two hosts' stores by
// address (docs/fleet.md, "Moving objects"): the source serves its store
// ([Handler]: GET /v1/objects/{addr}, POST /v1/objects/missing) and the
// target pulls what it lacks ([Fetch]). Pulling by the target is the only
// direction: the host that will hold the objects is the one that checks
// them, and a peer is hostile input like a bundle.
//
// # What Fetch checks
//
// [Fetch] walks a record as an export does ([bundle.Reached]'s order:
// each object after the objects it refers to) and fetches each object the
// store lacks. The record says what each object is, and so what its refs
// are, exactly as an import judges a bundle: an attestation refers to its
// receipt and journal (attest.Open), an image snapshot is a listing that
// refers to its files ([store.DecodeListing], strictly, under the store's
// listing limits), everything else refers to nothing. Every object is
// held to the Content-Length its peer declares, which must be within the
// limits ([Options]) and, for a listed file, the size its listing gives;
// its bytes are hashed as they arrive, and it is adopted into the store
// ([store.Store.Adopt], which hashes it again as it makes it durable; an
// attestation or listing, read whole to be decoded, through
// [store.Store.PutBytes]) only if they are as many as declared and hash
// to the address asked for — after its refs, and with them declared.
//
// # Partial progress
//
// The first refusal ends a fetch and adopts nothing more. What was adopted
// before it is whole and verified, with its refs; another fetch skips it.
// Objects no record comes to reach are collected by the store's GC after
// its grace period. A refused fetch leaves nothing in staging.
//
// # Errors
//
// A refusal wraps [ErrAbsent], [ErrTruncated], [ErrLimit], [ErrMalformed]
// or [ErrPeer], or is a [*store.CorruptError] (bytes that hash to another
// address: [store.ErrCorrupt]). Errors of the connection itself are
// returned as net/http gives them.
package transfer
