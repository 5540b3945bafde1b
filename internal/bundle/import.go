package bundle

import (
	"context"
	"fmt"
	"io"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ImportOptions are what [Import] judges and stores a bundle by: the
// importing host's decisions.
type ImportOptions struct {
	// Options judge the bundle as [Stage] does. A nil Granted is this
	// store's: whether it holds the run of the genesis handed off or as a
	// copy (the host granted the grants then).
	Options
	// ID is the run id to store the run under; empty, the bundle's own.
	ID string
	// Reclaim takes back a run this host handed off with a bundle that
	// adds nothing to it (the very bundle exported): the operator's word
	// that no other host resumed from it.
	Reclaim bool
	// CheckID judges a run id (ID before the bundle is read, the id chosen
	// after): the host's rule for ids. Nil: the store's rule alone.
	CheckID func(id string) error
	// Lock, when not nil, is called once the run id is chosen, before the
	// store is read for the run, and what it returns is called as Import
	// returns: the caller's lock on the run, held while the timeline is
	// judged and the run stored.
	Lock func(id string) (unlock func())
}

// Imported is a bundle imported.
type Imported struct {
	Run     string // the id the run is stored under
	Header  Header // bundle.json: Run is the id on the exporting host, Copy a copy held as one
	Record  *record.Record
	Spec    unit.Spec
	Grants  unit.Grants
	Signers []attest.Signer
	Objects int   // objects the bundle carried
	Bytes   int64 // their bytes
	// Extended: the run was held here, handed off or as a copy, and the
	// bundle's record was appended to it ([store.Store.Extend]).
	Extended bool
}

// Import reads a bundle from r and stores its run. It accepts nothing
// until everything checks: [Stage] judges the bundle (its members, limits,
// record, signers, the places of its attestations, manifests, grant
// policy, and that every object the record reaches is a member); then the
// run's timeline: a bundle of a run held here is taken only over the same
// id, only if this host handed the run off (or holds a copy), and only if
// its record extends the one held ([store.ErrRunExists],
// [store.ErrNotExtension]); a bundle of a genesis held under another id is
// [store.ErrGenesisHeld]. Only then are the objects adopted and the record
// stored, with the copy held as one or the handoff cleared in the same
// transaction. A refused bundle leaves the store as it was (its staged
// files are removed); a failure after adoption leaves only objects no
// record reaches, which GC removes.
func Import(ctx context.Context, st Store, r io.Reader, opts ImportOptions) (Imported, error) {
	return take(ctx, st, opts, func(o Options) (*arrival, error) {
		sb, err := Stage(ctx, st, r, o)
		if err != nil {
			return nil, err
		}
		return &arrival{
			Imported: Imported{Header: sb.Header, Record: sb.Record, Spec: sb.Spec, Grants: sb.Grants, Signers: sb.Signers,
				Objects: sb.Objects, Bytes: sb.Bytes},
			what:  fmt.Sprintf("bundle of %q", sb.Header.Run),
			adopt: func() error { return sb.Adopt(ctx, st) },
			close: func() { sb.Close() },
		}, nil
	})
}

// arrival is a run judged (its record, objects and grants), not yet
// stored: what [Import] and [ImportStored] hand to take.
type arrival struct {
	Imported        // Header.Run and Header.Copy say where it came from and how
	what     string // what errors name: "bundle of RUN"
	// adopt makes the objects the store's, each with its refs, once the
	// timeline is judged: a staged bundle's are moved in, a stored run's
	// refs declared.
	adopt func() error
	close func()
}

// take is an import after judge: the run id chosen and checked, the
// caller's lock taken, the timeline judged, the objects adopted, the
// record stored. judge is given the [Options] to judge by, with Granted
// defaulted to this store's. Nothing is written before the timeline is
// judged, and only objects (which GC collects unless a record reaches
// them) before the record is stored.
func take(ctx context.Context, st Store, opts ImportOptions, judge func(Options) (*arrival, error)) (Imported, error) {
	check := opts.CheckID
	if check == nil {
		check = func(string) error { return nil }
	}
	if opts.ID != "" {
		if err := check(opts.ID); err != nil {
			return Imported{}, err
		}
	}
	o := opts.Options
	if o.Granted == nil {
		o.Granted = func(g record.Address) bool { return heldElsewhere(st, g) }
	}
	a, err := judge(o)
	if err != nil {
		return Imported{}, err
	}
	if a.close != nil {
		defer a.close()
	}
	id := opts.ID
	if id == "" {
		id = a.Header.Run
	}
	if err := check(id); err != nil {
		return Imported{}, err
	}
	if opts.Lock != nil {
		defer opts.Lock(id)()
	}
	extend, err := timeline(st, id, a.Record, a.what, opts.Reclaim)
	if err != nil {
		return Imported{}, err
	}
	if err := a.adopt(); err != nil {
		return Imported{}, err
	}
	// A copy is held as one in the same transaction that stores it. The
	// header's copy flag is not signed (docs/trust.md, "One timeline per run").
	if extend {
		_, err = st.Extend(id, a.Record, a.Header.Copy, opts.Reclaim)
	} else {
		err = st.ImportAs(id, a.Record, a.Header.Copy)
	}
	if err != nil {
		return Imported{}, err
	}
	im := a.Imported
	im.Run, im.Extended = id, extend
	return im, nil
}

// timeline judges the run of rec (what names it in errors) against the
// runs st holds, before anything is adopted (the store checks again as it
// stores the record): one timeline per run. It reports whether the run is
// held here under id, and rec extends it.
func timeline(st Runs, id string, rec *record.Record, what string, reclaim bool) (bool, error) {
	if _, err := st.Run(id); err == nil {
		if err := st.CheckExtend(id, rec, reclaim); err != nil {
			return false, err
		}
		return true, nil
	}
	held, ok, err := st.RunOfGenesis(rec.Genesis())
	if err != nil {
		return false, err
	}
	if ok {
		return false, fmt.Errorf("%s: %w: run %s", what, store.ErrGenesisHeld, held)
	}
	return false, nil
}

// heldElsewhere says whether st holds the run of genesis g as handed off
// or as a copy: a bundle of it carries grants this host already granted.
func heldElsewhere(st Runs, g record.Address) bool {
	id, ok, err := st.RunOfGenesis(g)
	if err != nil || !ok {
		return false
	}
	_, off, err := st.HandedOff(id)
	return err == nil && off
}
