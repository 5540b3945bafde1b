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
	sb, err := Stage(ctx, st, r, o)
	if err != nil {
		return Imported{}, err
	}
	defer sb.Close()
	id := opts.ID
	if id == "" {
		id = sb.Header.Run
	}
	if err := check(id); err != nil {
		return Imported{}, err
	}
	if opts.Lock != nil {
		defer opts.Lock(id)()
	}
	extend, err := timeline(st, id, sb, opts.Reclaim)
	if err != nil {
		return Imported{}, err
	}
	if err := sb.Adopt(ctx, st); err != nil {
		return Imported{}, err
	}
	// A copy is held as one in the same transaction that stores it. The
	// header's copy flag is not signed (docs/trust.md, "Copies").
	if extend {
		_, err = st.Extend(id, sb.Record, sb.Header.Copy, opts.Reclaim)
	} else {
		err = st.ImportAs(id, sb.Record, sb.Header.Copy)
	}
	if err != nil {
		return Imported{}, err
	}
	return Imported{Run: id, Header: sb.Header, Record: sb.Record, Spec: sb.Spec, Grants: sb.Grants, Signers: sb.Signers,
		Objects: sb.Objects, Bytes: sb.Bytes, Extended: extend}, nil
}

// timeline judges the bundle's run against the runs st holds, before
// anything is adopted (the store checks again as it stores the record):
// one timeline per run. It reports whether the run is held here under id,
// and the bundle extends it.
func timeline(st Runs, id string, sb *Staged, reclaim bool) (bool, error) {
	rec := sb.Record
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
		return false, fmt.Errorf("bundle of %q: %w: run %s", sb.Header.Run, store.ErrGenesisHeld, held)
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
