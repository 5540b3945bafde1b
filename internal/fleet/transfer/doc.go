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
// store lacks for the run: every object but those the store's record of
// the same genesis, which the record extends, reaches ([Stage]). The
// record says what each object is, and so what its refs
// are, exactly as an import judges a bundle: an attestation refers to its
// receipt and journal (attest.Open), an image snapshot is a listing that
// refers to its files ([store.DecodeListing], strictly, under the store's
// listing limits), everything else refers to nothing. Every object is
// held to the Content-Length its peer declares, which must be within the
// limits ([Options]) and, for a listed file, the size its listing gives;
// its bytes are hashed as they are written to staging, and it is adopted
// into the store ([Fetched.AdoptAll], taking that hash:
// store.Adoption.Hashed) only if they are as many as declared and hash to
// the address asked for — after its refs, and with them declared.
//
// # Nothing kept of a refused fetch
//
// [Stage] stages every object it fetches and adopts none: the
// [Fetched] it returns is judged in place (it is a bundle.Holding: an
// import's checks read the staged objects and the store's alike) and its
// objects are adopted only as the run is stored, each after its refs.
// The first refusal ends a fetch; a refused fetch, or a run refused after
// it, leaves the store as it was and nothing in staging. [Fetch] is Stage
// and the adoption, for a caller that judges nothing.
//
// # A chunk at a time
//
// A slab (docs/store.md, "Slabs") can also come one range at a time:
// [ReadRange] asks for one chunk and keeps it only if it hashes to the
// chunk's record in the verified index (the source serves a range
// unverified: only the whole object hashes to its address), and an
// [Owed] slab is filled chunk by chunk, the one asked for first, then the
// bytes no chunk covers, and adopted only once the whole hashes to its
// address.
//
// # Limits
//
// A fetch is held to what an import holds a bundle to ([bundle.Limits]):
// one object, all bytes, a decoded document, and the count of objects the
// record reaches, held ones included; and with Options.Free, the room the
// store's filesystem has past its minimum free space (--min-free).
//
// # Errors
//
// A refusal wraps [ErrAbsent], [ErrTruncated], [ErrLimit], [ErrNoSpace], [ErrMalformed],
// [ErrChunk], [ErrOwed] or [ErrPeer], or is a [*store.CorruptError] (bytes that hash to another
// address: [store.ErrCorrupt]). Errors of the connection itself are
// returned as net/http gives them.
package transfer
