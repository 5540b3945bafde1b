package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// DefaultTTL is a host lease's time to live when [Dir.Join] is given 0.
const DefaultTTL = 10 * time.Second

// retryEvery is how soon a keepalive that failed is tried again.
const retryEvery = 200 * time.Millisecond

// Session is one session of an admitted host in the fleet: its lease, kept
// alive, under which it owns runs.
//
// The session ends when the lease is lost — expired, revoked, or not
// confirmed before it would have expired — and never comes back: [Session.Done]
// is closed, every later call fails with ErrLeaseLost (wrapped with
// ErrNotOwner), and the host joins again with a new [Dir.Join], after which
// it re-claims its runs ([Session.Claim]).
type Session struct {
	*Dir
	key   record.Address
	lease clientv3.LeaseID
	ttl   time.Duration

	mu    sync.Mutex
	valid time.Time // the lease surely lives until then
	lost  error     // why the session ended; nil while it lives

	done     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// Join starts a session of the host key: it must be admitted with
// [RoleHost] (ErrNotAdmitted), and no other session of it may be live
// (ErrHostActive). ttl is the lease's time to live ([DefaultTTL] when 0);
// etcd raises a ttl under its minimum (1.5 election timeouts).
func (d *Dir) Join(ctx context.Context, key record.Address, ttl time.Duration) (*Session, error) {
	return d.JoinAt(ctx, key, ttl, "")
}

// JoinAt is Join for a host that serves the fleet on peer (host:port, its
// mutual-TLS listener): the session says so, for the hosts that move runs
// to or from it (Member.Peer).
func (d *Dir) JoinAt(ctx context.Context, key record.Address, ttl time.Duration, peer string) (*Session, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	m, err := d.Member(ctx, key)
	if err != nil {
		return nil, err
	}
	if m.Role != RoleHost {
		return nil, fmt.Errorf("host %s: %w: admitted as %s", key, ErrNotAdmitted, m.Role)
	}
	bctx, cancel := d.bounded(ctx)
	defer cancel()
	sent := time.Now()
	g, err := d.cli.Grant(bctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return nil, unavailable("join "+key.String(), err)
	}
	ak := d.aliveKey(key)
	r, err := d.cli.Txn(bctx).If(clientv3.Compare(clientv3.CreateRevision(ak), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(d.hostKey(key)), ">", 0)).
		Then(clientv3.OpPut(ak, peer, clientv3.WithLease(g.ID))).Commit()
	if err != nil || !r.Succeeded {
		rctx, rcancel := d.bounded(context.WithoutCancel(ctx))
		_, _ = d.cli.Revoke(rctx, g.ID) // best effort: it expires anyway
		rcancel()
	}
	if err != nil {
		return nil, unavailable("join "+key.String(), err)
	}
	if !r.Succeeded {
		return nil, fmt.Errorf("host %s: %w", key, ErrHostActive)
	}
	h := &Session{Dir: d, key: key, lease: g.ID, ttl: time.Duration(g.TTL) * time.Second,
		valid: sent.Add(time.Duration(g.TTL) * time.Second), done: make(chan struct{}), stop: make(chan struct{})}
	h.wg.Add(1)
	go h.keepAlive()
	return h, nil
}

// Drain marks this session as being drained (Member.Draining): the other
// hosts stop offering it runs. The mark is under the session's lease, so
// it ends with the session — as a drained host takes runs again once it
// restarts.
func (h *Session) Drain(ctx context.Context) error {
	if err := h.live(); err != nil {
		return err
	}
	ctx, cancel := h.bounded(ctx)
	defer cancel()
	r, err := h.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(h.aliveKey(h.key)), "=", int64(h.lease))).
		Then(clientv3.OpPut(h.drainingKey(h.key), "", clientv3.WithLease(h.lease))).Commit()
	if err != nil {
		return unavailable("drain "+h.key.String(), err)
	}
	if !r.Succeeded {
		return fmt.Errorf("host %s: %w", h.key, ErrLeaseLost)
	}
	return nil
}

// Key returns the host's key id.
func (h *Session) Key() record.Address { return h.key }

// TTL is the lease's time to live, as etcd granted it.
func (h *Session) TTL() time.Duration { return h.ttl }

// Lease returns the session's lease.
func (h *Session) Lease() int64 { return int64(h.lease) }

// Done is closed when the session ends; [Session.Err] then says why.
func (h *Session) Done() <-chan struct{} { return h.done }

// Err returns why the session ended (wrapping ErrLeaseLost), or nil.
func (h *Session) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// ValidUntil returns the instant until which the lease surely lives: the
// time the last confirmed keepalive was sent, plus the TTL etcd granted.
// etcd cannot expire the lease before then, so no other host can take
// this host's runs before then either. A host must have stopped executing
// its runs by then when the lease is not confirmed again
// (docs/fleet.md, "A host without its lease").
func (h *Session) ValidUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.valid
}

// keepAlive renews the lease every third of its TTL, and ends the session
// when etcd says the lease is gone or no renewal is confirmed before it
// would have expired.
func (h *Session) keepAlive() {
	defer h.wg.Done()
	wait := h.ttl / 3
	for {
		t := time.NewTimer(wait)
		select {
		case <-h.stop:
			t.Stop()
			return
		case <-t.C:
		}
		valid := h.ValidUntil()
		if !time.Now().Before(valid) {
			h.end(fmt.Errorf("host %s: %w: not confirmed since %s", h.key, ErrLeaseLost, valid.Add(-h.ttl).Format(time.RFC3339Nano)))
			return
		}
		sent := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), valid)
		r, err := h.cli.KeepAliveOnce(ctx, h.lease)
		cancel()
		switch {
		case err == nil && r.TTL > 0:
			h.mu.Lock()
			h.valid = sent.Add(time.Duration(r.TTL) * time.Second)
			h.mu.Unlock()
			wait = h.ttl / 3
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && r.TTL <= 0):
			h.end(fmt.Errorf("host %s: %w: etcd has no lease %x", h.key, ErrLeaseLost, int64(h.lease)))
			return
		default:
			wait = retryEvery
		}
	}
}

// end ends the session with err, once.
func (h *Session) end(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost == nil {
		h.lost = err
		close(h.done)
	}
}

// live returns the error to fail an operation with when the session has
// ended or its lease is past its confirmed life, or nil.
func (h *Session) live() error {
	h.mu.Lock()
	lost, valid := h.lost, h.valid
	h.mu.Unlock()
	if lost != nil {
		return fmt.Errorf("%w: %w", ErrNotOwner, lost)
	}
	if !time.Now().Before(valid) {
		return fmt.Errorf("%w: %w: host %s: not confirmed in time", ErrNotOwner, ErrLeaseLost, h.key)
	}
	return nil
}

// Close ends the session and revokes its lease, so the host's runs are
// orphans at once instead of after the TTL. A revoke etcd does not confirm
// is ErrUnavailable; the lease then expires by itself.
func (h *Session) Close(ctx context.Context) error {
	h.stopOnce.Do(func() { close(h.stop) })
	h.wg.Wait()
	h.end(fmt.Errorf("host %s: %w: closed", h.key, ErrLeaseLost))
	ctx, cancel := h.bounded(ctx)
	defer cancel()
	if _, err := h.cli.Revoke(ctx, h.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return unavailable("close "+h.key.String(), err)
	}
	return nil
}
