package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
)

// Verify verifies a run's record from genesis and rehashes every object it
// reaches ([bundle.Verify]); the image snapshots of a run whose snapshots
// were released are not asked for. A record or object that fails is
// reported in the result (Err), not as a failed request. It takes no
// run's lock.
func (d *Daemon) Verify(ctx context.Context, id string) (answers.Verification, error) {
	if _, err := d.st.Run(id); err != nil {
		return answers.Verification{}, err
	}
	ret, err := d.st.RetentionOf(id)
	released := err == nil && !ret.Released.IsZero()
	v, err := bundle.Verify(ctx, d.st, id, d.keys.Trusted, !released)
	out := answers.Verification{Run: id, Objects: v.Objects, Bytes: v.Bytes, Err: err}
	if o, ok, oerr := d.fleet.OwingOf(id); oerr == nil && ok {
		a := owingOf(o)
		out.Owed, out.Owing = o.Slabs, &a
	}
	if rec := v.Record; rec != nil {
		out.Segments, out.Phase, out.Head, out.WaitProof = rec.Len(), rec.Phase(), rec.Head(), rec.WaitProof()
		out.Signers = d.keys.Names(v.Signers)
	}
	return out, nil
}

// Stdout is where run id's unit output goes on this host.
func (d *Daemon) Stdout(id string) string { return d.intervals.Output(id).Stdout }
