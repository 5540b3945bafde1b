package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

var (
	// ErrResultsHeld refuses the export of a run with results posted on
	// this host for calls it still awaits.
	ErrResultsHeld = errors.New("results held on this host")
)

// Exportable says whether run id can be exported now: only a parked run
// can ([bundle.Exportable]), and only if no result posted here awaits the
// run's other calls.
func (d *Daemon) Exportable(id string) error {
	if err := bundle.Exportable(d.st, id); err != nil {
		return err
	}
	// Results posted here for calls the run still awaits stay here: a
	// bundle does not carry them, and the host importing it would show
	// those calls as unanswered.
	if held, err := d.resultsHeld(id); err == nil && len(held) > 0 {
		return fmt.Errorf("export %s: %w: results are posted here for %s, which the run still awaits with others; post the rest (the run resumes here), or close it", id, ErrResultsHeld, strings.Join(held, ", "))
	}
	return nil
}

// Export writes run id's bundle to w ([bundle.Export]). With handoff (the
// default of the API and the CLI) the run is handed off before the first
// byte is written ([bundle.Prepare]): from then on this host refuses to
// resume, close or post results to it, until a bundle extending its record
// is imported back. Without handoff the bundle is marked a copy. A failed
// export takes its handoff back unless a bundle may be out there
// ([bundle.Exports]).
func (d *Daemon) Export(ctx context.Context, id string, w io.Writer, handoff bool) (err error) {
	// Read and handed off under the run's lock, so that a resume or a
	// close cannot come between; streamed without it.
	r, err := d.lockRun(id)
	if err != nil {
		return err
	}
	err = d.Exportable(id)
	var o bundle.ExportOptions
	var made bool
	if err == nil {
		o, made, err = d.exports.Begin(d.st, id, handoff)
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		switch ended, rerr := d.exports.End(d.st, id, o, made, err); {
		case rerr != nil:
			d.log.Error("export failed and its handoff could not be taken back", "run", id, "err", rerr)
		case ended == bundle.HandedOff:
			d.log.Info("run handed off", "run", id, "head", o.Record.Head())
			d.publish(events.Event{Kind: "run.handed_off", Run: id})
		case ended == bundle.TakenBack:
			d.log.Warn("export failed before its bundle was whole: the handoff is taken back", "run", id, "err", err)
		}
	}()
	return bundle.Export(ctx, d.st, id, w, o)
}

// Import reads a bundle and stores its run as id (the bundle's own id when
// empty), accepting nothing until everything checks ([bundle.Import]).
func (d *Daemon) Import(ctx context.Context, r io.Reader, id string) (Imported, error) {
	return d.ImportWith(ctx, r, id, false)
}

// ImportWith is Import; with reclaim, a bundle of a run this host handed
// off that adds nothing to it (the very bundle exported) takes the run
// back: the operator's word that no other host resumed from it.
func (d *Daemon) ImportWith(ctx context.Context, r io.Reader, id string, reclaim bool) (Imported, error) {
	var rl *run
	im, err := bundle.Import(ctx, d.st, r, bundle.ImportOptions{
		Options: d.bundleOptions(), ID: id, Reclaim: reclaim, CheckID: checkID,
		// The run's lock is held past the import, until its summary for
		// the reply is read.
		Lock: func(id string) func() { rl = d.lock(id); return func() {} },
	})
	if rl != nil {
		defer rl.mu.Unlock()
	}
	if err != nil {
		return Imported{}, err
	}
	d.fillCalls(im.Run)
	unclaimed := d.fleet.ClaimImported(ctx, im)
	sum, err := d.summary(im.Run, rl)
	if err != nil {
		return Imported{}, err
	}
	d.log.Info("run imported", "run", im.Run, "from", im.Header.Run, "objects", im.Objects, "bytes", im.Bytes, "copy", im.Header.Copy)
	return Imported{Run: sum, Objects: im.Objects, Bytes: im.Bytes, Grants: grantsOf(im.Grants), Signers: d.Signers(im.Signers), Unclaimed: unclaimed}, nil
}

// notHandedOff refuses an operation on a run an export handed to another
// host, or held here as a copy ([bundle.HeldHere]).
func (d *Daemon) notHandedOff(id string) error { return bundle.HeldHere(d.st, id) }

// grantsOf returns an imported bundle's grants as a copy (Import's
// answer).
func grantsOf(g unit.Grants) unit.Grants {
	g.ReadOnly = append([]unit.Mount(nil), g.ReadOnly...)
	return g
}
