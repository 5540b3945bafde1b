package fleet

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Revoke removes key's membership and revokes the lease of its live
// session, if any (ErrNotAdmitted when it has neither): its alive/ and
// draining/ keys go with the lease, so its fence refuses every further
// append (each compares the writer's alive/ key with its lease), it cannot
// join again (it is not admitted), and the runs it owned are orphans,
// which other hosts may adopt. It returns the member as it was, with the
// lease it revoked (0: no live session).
//
// Every host serving the fleet sees the removal through WatchRevoked and
// cuts the key's open peer connections; a new handshake of the key is
// refused, as any key not admitted.
func (d *Dir) Revoke(ctx context.Context, key record.Address) (Member, error) {
	ctx, cancel := d.bounded(ctx)
	defer cancel()
	hk := d.hostKey(key)
	r, err := d.cli.Txn(ctx).Then(clientv3.OpGet(hk), clientv3.OpGet(d.aliveKey(key)), clientv3.OpDelete(hk)).Commit()
	if err != nil {
		return Member{}, unavailable("revoke "+key.String(), err)
	}
	hosts, alive := r.Responses[0].GetResponseRange().Kvs, r.Responses[1].GetResponseRange().Kvs
	if len(hosts) == 0 && len(alive) == 0 {
		return Member{}, fmt.Errorf("host %s: %w", key, ErrNotAdmitted)
	}
	m := Member{Key: key}
	if len(hosts) == 1 {
		if dm, err := decodeMember(key, hosts[0].Value); err == nil {
			m = dm // else removed all the same; its value said nothing
		}
	}
	// A session left by an earlier revocation whose lease revoke failed is
	// revoked now: revoking again finishes the job.
	if len(alive) == 1 && alive[0].Lease != 0 {
		m.Lease = alive[0].Lease
		if _, err := d.cli.Revoke(ctx, clientv3.LeaseID(m.Lease)); err != nil {
			return m, unavailable(fmt.Sprintf("revoke %s: membership removed, but its lease %x", key, m.Lease), err)
		}
	}
	return m, nil
}

// watchRetry is how soon a watch that ended is opened again.
const watchRetry = time.Second

// WatchRevoked calls revoked with each key whose membership is removed
// (Revoke, or a delete under hosts/ by other means), and admitted with
// each key admitted (again), as etcd's watch reports them, until ctx is
// done. A watch that ends (a member lost, the
// connection cut) is opened again from the revision after the last one
// seen, so no removal is missed; one whose revision was compacted meanwhile
// starts from now, and calls resync first, which must judge again every
// key it holds (a removal in the compacted gap is not reported).
func (d *Dir) WatchRevoked(ctx context.Context, revoked, admitted func(record.Address), resync func()) {
	var next int64 // the first revision not yet seen; 0: from now
	for ctx.Err() == nil && next == 0 {
		bctx, cancel := d.bounded(ctx)
		if r, err := d.cli.Get(bctx, d.hostsPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil {
			next = r.Header.Revision + 1
		}
		cancel()
		if next == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(watchRetry):
			}
		}
	}
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix()}
		if next > 0 {
			opts = append(opts, clientv3.WithRev(next))
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range d.cli.Watch(wctx, d.hostsPrefix(), opts...) {
			if resp.CompactRevision != 0 {
				next = 0
				resync()
				break
			}
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				next = ev.Kv.ModRevision + 1
				key, err := keyAddress(string(ev.Kv.Key), d.hostsPrefix())
				switch {
				case err != nil:
				case ev.Type == mvccpb.DELETE:
					revoked(key)
				default:
					admitted(key)
				}
			}
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(watchRetry):
		}
	}
}
