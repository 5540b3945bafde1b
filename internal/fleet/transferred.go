package fleet

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Seen is a run's entry and the lease of its owner's live session (0 when
// none), read at one revision (Dir.Transferred); Session.ClaimSeen claims on
// it.
type Seen struct {
	entry      Entry
	ownerLease int64
}

// Entry is the run's entry as read.
func (s Seen) Entry() Entry { return s.entry }

// OwnerLease is the lease its owner's live session had (0: none).
func (s Seen) OwnerLease() int64 { return s.ownerLease }

// Transferred returns the run's entry (ErrNoRun when the directory has
// none) and the lease of owner's live session, read at one revision in one
// request: what a host asked by owner to take a run checks before it
// fetches a byte of it (the entry's To names it, its Owner is owner, whose
// session is the one that claimed it, and its Head is the one offered). An
// entry written before transfers named a target has a zero To.
func (d *Dir) Transferred(ctx context.Context, genesis, owner record.Address) (Seen, error) {
	ctx, cancel := d.bounded(ctx)
	defer cancel()
	r, err := d.cli.Txn(ctx).Then(clientv3.OpGet(d.runKey(genesis)), clientv3.OpGet(d.aliveKey(owner))).Commit()
	if err != nil {
		return Seen{}, unavailable("run "+genesis.String(), err)
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Seen{}, fmt.Errorf("run %s: %w", genesis, ErrNoRun)
	}
	e, err := decodeEntry(genesis, kvs[0].Value, kvs[0].ModRevision)
	if err != nil {
		return Seen{}, err
	}
	if e.Owner != owner {
		return Seen{entry: e}, nil // owner's lease is not the entry owner's
	}
	return Seen{entry: e, ownerLease: leaseOf(r.Responses[1])}, nil
}
