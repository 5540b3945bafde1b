package daemon

import (
	"context"
	"io"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/forms"
)

// ImportWith reads a bundle and stores its run as id (the bundle's own id
// when empty), accepting nothing until everything checks
// ([bundle.Import]); with reclaim, a bundle of a run this host handed off
// that adds nothing to it (the very bundle exported) takes the run back:
// the operator's word that no other host resumed from it.
func (d *Daemon) ImportWith(ctx context.Context, r io.Reader, id string, reclaim bool) (answers.Imported, error) {
	var rl *run
	im, err := bundle.Import(ctx, d.st, r, bundle.ImportOptions{
		Options: d.bundles, ID: id, Reclaim: reclaim, CheckID: forms.CheckID,
		// The run's lock is held past the import, until its summary for
		// the reply is read.
		Lock: func(id string) func() { rl = d.runs.lock(id); return func() {} },
	})
	if rl != nil {
		defer rl.mu.Unlock()
	}
	if err != nil {
		return answers.Imported{}, err
	}
	if err := calls.Fill(d.st, im.Run); err != nil {
		d.log.Warn("call ledger: the imported run's calls are listed without their payloads until the next start", "run", im.Run, "err", err)
	}
	unclaimed := d.fleet.ClaimImported(ctx, im)
	sum, err := d.runs.summary(im.Run, rl)
	if err != nil {
		return answers.Imported{}, err
	}
	d.log.Info("run imported", "run", im.Run, "from", im.Header.Run, "objects", im.Objects, "bytes", im.Bytes, "copy", im.Header.Copy)
	return answers.Imported{Run: sum, Objects: im.Objects, Bytes: im.Bytes, Grants: im.Grants, Signers: d.keys.Names(im.Signers), Unclaimed: unclaimed}, nil
}
