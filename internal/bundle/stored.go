package bundle

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Holding is a store whose objects [ImportStored] judges where they are.
// PutBytes of bytes it holds already adds refs to the object's declared
// refs ([store.Store.PutBytes]): how ImportStored declares the refs an
// object's bytes give, as an import adopts a member with them.
// *store.Store is one.
type Holding interface {
	Store
	PutBytes(b []byte, refs ...record.Address) (record.Address, error)
}

// VerifiedOnArrival is a [Holding] whose objects are partly staged, not
// stored (internal/fleet/transfer's Fetched): an object it says was
// verified on arrival had its bytes hashed to its address in this process
// as they were written to staging, and nothing writes them since (the
// word [store.Store.IngestHashed] takes from a park). [ImportStored] does
// not rehash it.
type VerifiedOnArrival interface {
	VerifiedOnArrival(a record.Address) bool
}

// Rehashed is a [Holding] that rehashed, in this process, objects it held
// already while it fetched the rest (internal/fleet/transfer's Fetched):
// [ImportStored] does not read again one it says hashed to its address.
type Rehashed interface {
	Rehashed(a record.Address) bool
}

// Owing is a [Holding] that lacks objects a post-copy migration owes it
// (internal/fleet/transfer): slabs of the record's last memory image, each
// verified as it arrives after the import and declared as a ref once
// stored (store.Store.Settle). Its Size gives an owed slab's listed size;
// [ImportStored] does not rehash an owed slab, and declares every ref but
// the owed ones.
type Owing interface {
	Owes(a record.Address) bool
}

// StoredOptions are what [ImportStored] judges and stores a record by:
// the importing host's decisions ([ImportOptions]), and what a bundle's
// bundle.json would say of the run.
type StoredOptions struct {
	ImportOptions
	// Run is the run's id on the host the objects came from (a bundle's
	// "run"): the id the run is stored under unless ID names another, and
	// what errors name.
	Run string
	// Copy: the source still holds the run (a bundle's "copy"), which this
	// host then holds as a copy, never resumed, until the run is handed
	// off to it (docs/trust.md, "One timeline per run"). Like bundle.json's flag, it is
	// the caller's word, not signed.
	Copy bool
}

// ImportStored stores the run of rec, whose objects are already in st (as
// internal/fleet/transfer's Fetch leaves them), with the decision [Import] makes
// of a bundle of the same run, in the same order and with the same
// errors: rec verifies from genesis and is parked; its unit spec and grant
// set decode, validate and pass this host's policy; every manifest
// decodes and names its keys; every attestation is signed by a trusted
// key and stands at its place; every listing decodes and gives each file
// the size it has; every object rec reaches is in st
// ([store.ErrMissingObject]), within the object and total limits
// ([ErrLimit]), and rehashes to its address ([*store.CorruptError]; one
// st verified on arrival, [VerifiedOnArrival], or rehashed already,
// [Rehashed], is not read again); then
// the run's timeline, as Import judges it. Only then are the refs each
// object's bytes give declared in st (those it lacks), and the record
// stored ([store.Store.ImportAs] or [store.Store.Extend]).
//
// What a bundle's header says comes in through opts: Run (bundle.json's
// "run") and Copy ("copy"). Imported.Header carries them, with Objects
// and Bytes the objects rec reaches and their bytes; its Format is empty.
//
// A refusal of these checks writes nothing: st's runs, records and
// objects are as they were. (A refusal by the store as it stores the
// record comes after the refs are declared, and leaves them, as Import
// leaves its adopted objects.) The objects stay: they are not the run's until a record
// reaches them, and GC collects them after its grace period, so the
// caller imports within it of the fetch.
//
// st is the caller's word that it holds the objects for this run: over a
// store as it is, a record may name any object held for another run. A
// migration judges internal/fleet/transfer's Fetched, whose Stage fetched
// every object not held for the run (docs/fleet.md, "Moving objects").
func ImportStored(ctx context.Context, st Holding, rec *record.Record, opts StoredOptions) (Imported, error) {
	return take(ctx, st, opts.ImportOptions, func(o Options) (*arrival, error) {
		what := fmt.Sprintf("record of %q", opts.Run)
		if err := rec.Verify(); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if p := rec.Phase(); p != record.PhaseParked {
			return nil, fmt.Errorf("%w: %s: the run is %s: only a parked run is imported", ErrMalformed, what, p)
		}
		h := &holding{ctx: ctx, st: st, verified: map[record.Address]bool{}}
		j := newJudging(h, rec, what, o)
		lim := o.Limits.Or(DefaultLimits)
		var n int
		var size int64
		checks := append(j.checks(),
			func() (err error) { n, size, err = h.limits(j, lim); return err },
			func() error { return h.verify(j) },
		)
		if err := run(checks); err != nil {
			return nil, err
		}
		return &arrival{
			Imported: Imported{Header: Header{Run: opts.Run, Copy: opts.Copy, Objects: n, Bytes: size},
				Record: rec, Spec: j.spec, Grants: j.grants, Signers: j.signers, Objects: n, Bytes: size},
			what:  what,
			adopt: func() error { return h.declare(j) },
		}, nil
	})
}

// holding is a store as the checks' [source]: every object read is read
// verified, and remembered so.
type holding struct {
	ctx      context.Context
	st       Holding
	verified map[record.Address]bool
}

func (h *holding) size(a record.Address) (int64, error) { return h.st.Size(a) }

func (h *holding) read(a record.Address) ([]byte, error) {
	r, err := h.st.Open(a)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(r) // r returns io.EOF only if the bytes hash to a
	if err != nil {
		return nil, err
	}
	h.verified[a] = true
	return b, nil
}

// limits holds the objects the record reaches to what a bundle of them
// would be held to: at most lim.Objects of them, each within lim.Object,
// all within lim.Total. It returns their count and bytes.
func (h *holding) limits(j *judging, lim Limits) (int, int64, error) {
	if len(j.need) > lim.Objects {
		return 0, 0, fmt.Errorf("%w: %s: the record reaches %d objects, the limit is %d", ErrLimit, j.what, len(j.need), lim.Objects)
	}
	var total int64
	for _, a := range sorted(j.need) {
		n, err := h.st.Size(a)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", j.what, err)
		}
		if n > lim.Object {
			return 0, 0, fmt.Errorf("%w: %s: object %s of %d bytes, the limit is %d", ErrLimit, j.what, a, n, lim.Object)
		}
		if total += n; total > lim.Total {
			return 0, 0, fmt.Errorf("%w: %s: the record reaches more than %d bytes of objects", ErrLimit, j.what, lim.Total)
		}
	}
	return len(j.need), total, nil
}

// verify rehashes every object the record reaches that was not read
// whole (and so verified) by the checks before, verified on arrival
// (VerifiedOnArrival), rehashed by the fetch (Rehashed), nor owed
// (Owing): a transcript, a receipt, a journal, an image's files.
func (h *holding) verify(j *judging) error {
	buf := make([]byte, 1<<20)
	arrived, _ := h.st.(VerifiedOnArrival)
	rehashed, _ := h.st.(Rehashed)
	owing, _ := h.st.(Owing)
	for _, a := range sorted(j.need) {
		if h.verified[a] || arrived != nil && arrived.VerifiedOnArrival(a) || rehashed != nil && rehashed.Rehashed(a) || owing != nil && owing.Owes(a) {
			continue
		}
		if err := h.rehash(a, buf); err != nil {
			return fmt.Errorf("%s: %w", j.what, err)
		}
		h.verified[a] = true
	}
	return nil
}

// rehash reads a through the store's verifying reader, checking the
// context between reads.
func (h *holding) rehash(a record.Address, buf []byte) error {
	r, err := h.st.Open(a)
	if err != nil {
		return err
	}
	defer r.Close()
	for {
		if err := h.ctx.Err(); err != nil {
			return err
		}
		if _, err := r.Read(buf); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// declare makes each object the store holds declare the refs its bytes
// give (an attestation its receipt and journal, a listing its files),
// those it lacks: what keeps them reachable, as [Staged.Adopt] adopts a
// member with its refs. The refs are held: carried checked them.
func (h *holding) declare(j *judging) error {
	owing, _ := h.st.(Owing)
	for _, a := range sorted(j.refs) {
		want := j.refs[a]
		if owing != nil {
			want = slices.DeleteFunc(slices.Clone(want), owing.Owes)
		}
		have, err := h.st.Refs(a)
		if err != nil {
			return err
		}
		if !missing(have, want) {
			continue
		}
		b, err := h.read(a)
		if err != nil {
			return err
		}
		if _, err := h.st.PutBytes(b, want...); err != nil {
			return err
		}
	}
	return nil
}

// missing says whether want holds an address have does not.
func missing(have, want []record.Address) bool {
	for _, a := range want {
		if !slices.Contains(have, a) {
			return true
		}
	}
	return false
}

// sorted returns m's keys in address order, so that a refusal is the same
// every time.
func sorted[V any](m map[record.Address]V) []record.Address {
	out := make([]record.Address, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y record.Address) int { return slices.Compare(x[:], y[:]) })
	return out
}
