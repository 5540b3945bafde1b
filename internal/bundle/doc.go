// Package bundle moves a run between hosts as a bundle (docs/bundle.md): a
// tar of its record and every object the record reaches. It exports a
// parked run from a store and imports one into a store, judging the bundle
// first: a bundle is hostile input to a root daemon.
//
// # Export
//
// [Prepare], under the caller's lock on the run, reads its parked record
// and hands the run off ([store.Store.HandOff]), or marks the export a
// copy; [Export] then streams the bundle: bundle.json, record.json and
// every object the record reaches ([Reached]), each after the objects it
// refers to, read verified: in [Format] (format 2), objects of at most
// [PackObject] bytes travel packed, many to a pack/N member, without a
// tar header each. Taking a handoff back when no bundle was
// delivered whole is the caller's: only it knows what else of the run is
// streaming.
//
// # Reading
//
// [Stage] streams the tar once into the store's staging area; it reads
// both formats ([Format1], [Format2]). Each member is refused before it is
// read unless it is a plain regular file within the limits ([Limits]) and
// the sizes bundle.json declared; its bytes are hashed as they are
// written, and reading stops at its declared size. A pack's objects are
// judged one by one as members are: each length before its bytes, each
// object's address the hash of its bytes. Then
// the record is checked: it verifies from genesis and is parked; every
// attestation verifies, is signed by a trusted key and stands at its place
// (attest.CheckRecord); every manifest names the keys its park form
// requires; the grant set passes the host's [Policy]; every object the
// record reaches is a member (a bundle is whole: what the importing store
// holds does not count), every member is one the record reaches, each
// comes after the members it refers to, and every listing's sizes are its
// files'. [Staged.Adopt] then moves the staged files into the store. A
// refused bundle costs at most its declared size in staging, removed by
// [Staged.Close].
//
// # Import
//
// [Import] stages and judges a bundle, then judges its run against the
// runs the store holds — one timeline per run (docs/trust.md): a run held
// here is taken back only if this host handed it off (or holds a copy) and
// the bundle's record extends it; a genesis held under another id is
// refused — and only then adopts the objects and stores the record
// ([store.Store.ImportAs], [store.Store.Extend]). What the importing host
// decides (trusted keys, grant policy, limits, its rule for run ids, its
// lock on the run) comes in through [ImportOptions]. A refused import
// leaves the store as it was.
//
// # Importing from the store
//
// [ImportStored] imports a record whose objects are already in the store
// (internal/fleet/transfer's Fetch put them there): the same checks as [Stage]'s
// judge, run by the same code over the store's verified objects instead
// of staged members, every object the record reaches rehashed, then the
// same timeline and storing as [Import]. A bundle header's run id and
// copy flag come in as [StoredOptions].
//
// # Errors
//
// A refusal wraps [ErrMalformed], [ErrLimit] or [ErrPolicy], or an error
// of internal/store ([store.ErrMissingObject], [store.CorruptError],
// [store.ErrGenesisHeld], [store.ErrNotExtension], [store.ErrRunExists]),
// pkg/attest (an untrusted signer, an attestation out of place) or
// pkg/record; docs/bundle.md maps each to the API's code.
//
// The store is reached through small interfaces ([Staging], [Objects],
// [Runs], [Store]), each of which *store.Store is.
package bundle
