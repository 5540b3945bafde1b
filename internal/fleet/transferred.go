package fleet

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Transferred returns the run's entry (ErrNoRun when the directory has
// none) and the lease of its owner's live session (0 when none), read at
// one revision: what a host asked to take a run checks before it fetches
// a byte of it (the entry's To names it, its Owner is the caller, whose
// session is the one that claimed it, and its Head is the one offered).
// An entry written before transfers named a target has a zero To.
func (d *Dir) Transferred(ctx context.Context, genesis record.Address) (Entry, int64, error) {
	ctx, cancel := d.bounded(ctx)
	defer cancel()
	r, err := d.cli.Get(ctx, d.runKey(genesis))
	if err != nil {
		return Entry{}, 0, unavailable("run "+genesis.String(), err)
	}
	if len(r.Kvs) == 0 {
		return Entry{}, 0, fmt.Errorf("run %s: %w", genesis, ErrNoRun)
	}
	e, err := decodeEntry(genesis, r.Kvs[0].Value, r.Kvs[0].ModRevision)
	if err != nil {
		return Entry{}, 0, err
	}
	o, err := d.cli.Get(ctx, d.aliveKey(e.Owner), clientv3.WithRev(r.Header.Revision))
	if err != nil {
		return Entry{}, 0, unavailable("run "+genesis.String(), err)
	}
	var lease int64
	if len(o.Kvs) == 1 {
		lease = o.Kvs[0].Lease
	}
	return e, lease, nil
}
