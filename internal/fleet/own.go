package fleet

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// maxAttempts bounds how often an operation reads the entry again after
// its transaction lost a race; each attempt's refusal is judged on what
// it read, so only a race that keeps being lost comes back as this.
const maxAttempts = 8

// Claim makes this host the owner of the run whose genesis is genesis,
// with the run's id here, at head and phase:
//
//   - a run the directory does not hold is created, owned by this host;
//   - a run this session owns already is left as it is (the same head and
//     phase) — claiming is idempotent;
//   - a run another host owns is taken over only when its owner's lease is
//     gone (it is an orphan, [Dir.Orphans]) or the owner transferred it
//     here ([Session.Transfer]); otherwise ErrNotOwner.
//
// The directory's head and phase must be head and phase (ErrHeadMoved),
// with one exception for the crash between an advance and the append it
// reserved: a run whose owner is this host key (an earlier session) may be
// claimed at the entry's previous head, which takes the reservation back
// (docs/fleet.md, "The order of the two writes").
func (h *Session) Claim(ctx context.Context, genesis record.Address, run string, head record.Address, phase record.Phase) (Entry, error) {
	if err := checkName(run); err != nil {
		return Entry{}, err
	}
	return h.update(ctx, "claim", genesis, nil, h.claim(genesis, run, head, phase))
}

// ClaimSeen is Claim judged first on seen, what Dir.Transferred read of
// the run before it was fetched: when the entry and its owner's session
// are still as seen, the claim is one request (the transaction compares
// both, as after a read); otherwise it reads afresh, as Claim does.
func (h *Session) ClaimSeen(ctx context.Context, seen Seen, run string, head record.Address, phase record.Phase) (Entry, error) {
	if err := checkName(run); err != nil {
		return Entry{}, err
	}
	genesis := seen.entry.Genesis
	return h.update(ctx, "claim", genesis, &seen, h.claim(genesis, run, head, phase))
}

// claim is Claim's judgement of the entry.
func (h *Session) claim(genesis record.Address, run string, head record.Address, phase record.Phase) func(Entry, bool, int64) (Entry, error) {
	return func(cur Entry, exists bool, ownerLease int64) (Entry, error) {
		if !exists {
			return Entry{Genesis: genesis, Run: run, Owner: h.key, Lease: int64(h.lease), Head: head, Phase: phase}, nil
		}
		if cur.Owner == h.key && cur.Lease == int64(h.lease) {
			if cur.Head != head || cur.Phase != phase {
				return Entry{}, moved(cur, head, phase)
			}
			return cur, errUnchanged
		}
		if cur.To != h.key && ownerLease == cur.Lease {
			return Entry{}, fmt.Errorf("run %s: %w: %s (lease %x alive)", genesis, ErrNotOwner, cur.Owner, cur.Lease)
		}
		next := cur
		next.Run, next.Owner, next.Lease, next.To = run, h.key, int64(h.lease), record.Address{}
		switch {
		case cur.Head == head && cur.Phase == phase:
		case cur.Owner == h.key && !cur.Prev.IsZero() && cur.Prev == head && cur.PrevPhase == phase:
			next.Head, next.Phase, next.Prev, next.PrevPhase = cur.Prev, cur.PrevPhase, record.Address{}, 0
		default:
			return Entry{}, moved(cur, head, phase)
		}
		return next, nil
	}
}

// Advance moves the run's head from prev to next, now in phase, as one
// etcd transaction that compares the entry as read (so its head is prev
// and its owner this session) and this host's live session. The run must
// be this session's and not transferred (ErrNotOwner), at prev
// (ErrHeadMoved). On success the entry keeps prev as its previous head.
//
// The daemon advances before it appends the segments that make next
// (docs/fleet.md): an advance is a reservation that [Session.Revert] takes
// back when the append is refused.
func (h *Session) Advance(ctx context.Context, genesis, prev, next record.Address, phase record.Phase) (Entry, error) {
	return h.update(ctx, "advance", genesis, nil, func(cur Entry, exists bool, _ int64) (Entry, error) {
		if err := h.owns(cur, exists); err != nil {
			return Entry{}, err
		}
		if cur.Head != prev {
			return Entry{}, fmt.Errorf("run %s: %w: directory at %s, advance from %s", genesis, ErrHeadMoved, cur.Head, prev)
		}
		n := cur
		n.Head, n.Phase, n.Prev, n.PrevPhase = next, phase, cur.Head, cur.Phase
		return n, nil
	})
}

// Revert takes back the last advance, made to reserved: the entry's head
// and phase become its previous ones. It is for an append refused (or not
// made) after its advance; the run must be this session's, at reserved,
// with a previous head (ErrHeadMoved otherwise).
func (h *Session) Revert(ctx context.Context, genesis, reserved record.Address) (Entry, error) {
	return h.update(ctx, "revert", genesis, nil, func(cur Entry, exists bool, _ int64) (Entry, error) {
		if err := h.owns(cur, exists); err != nil {
			return Entry{}, err
		}
		if cur.Head != reserved || cur.Prev.IsZero() {
			return Entry{}, fmt.Errorf("run %s: %w: directory at %s (previous %s), revert of %s", genesis, ErrHeadMoved, cur.Head, cur.Prev, reserved)
		}
		n := cur
		n.Head, n.Phase, n.Prev, n.PrevPhase = cur.Prev, cur.PrevPhase, record.Address{}, 0
		return n, nil
	})
}

// Transfer hands the run, parked (ErrNotParked), to the host to, which
// must be admitted as a host (ErrNotAdmitted). From then on this host may
// not advance it, and to may claim it at its head. Transferring to this
// host itself takes back a transfer that to has not claimed.
func (h *Session) Transfer(ctx context.Context, genesis, to record.Address) (Entry, error) {
	if to != h.key {
		m, err := h.Member(ctx, to)
		if err != nil {
			return Entry{}, err
		}
		if m.Role != RoleHost {
			return Entry{}, fmt.Errorf("host %s: %w: admitted as %s", to, ErrNotAdmitted, m.Role)
		}
	}
	return h.update(ctx, "transfer", genesis, nil, func(cur Entry, exists bool, _ int64) (Entry, error) {
		if !exists {
			return Entry{}, fmt.Errorf("run %s: %w", genesis, ErrNoRun)
		}
		if cur.Owner != h.key || cur.Lease != int64(h.lease) {
			return Entry{}, fmt.Errorf("run %s: %w: owned by %s", genesis, ErrNotOwner, cur.Owner)
		}
		if cur.Phase != record.PhaseParked {
			return Entry{}, fmt.Errorf("run %s: %w (it is %s)", genesis, ErrNotParked, cur.Phase)
		}
		n := cur
		n.To = to
		if to == h.key {
			n.To = record.Address{}
		}
		return n, nil
	})
}

// Remove deletes the entry of a run this session owns that never got past
// its genesis (head and phase as claimed at creation, no previous head):
// what a crash between a new run's claim and its creation in the store
// leaves (docs/fleet.md, "Reconciling at start"). Any other entry is
// ErrHeadMoved: a run that was advanced keeps its entry, so no host can
// create it afresh.
func (h *Session) Remove(ctx context.Context, genesis record.Address) error {
	_, err := h.update(ctx, "remove", genesis, nil, func(cur Entry, exists bool, _ int64) (Entry, error) {
		if err := h.owns(cur, exists); err != nil {
			return Entry{}, err
		}
		if cur.Head != genesis || cur.Phase != record.PhaseExecuting || !cur.Prev.IsZero() {
			return Entry{}, fmt.Errorf("run %s: %w: directory at %s (%s), not at its genesis", genesis, ErrHeadMoved, cur.Head, cur.Phase)
		}
		return Entry{}, errRemove
	})
	return err
}

// owns refuses an entry this session may not advance.
func (h *Session) owns(cur Entry, exists bool) error {
	switch {
	case !exists:
		return fmt.Errorf("run %s: %w", cur.Genesis, ErrNoRun)
	case cur.Owner != h.key || cur.Lease != int64(h.lease):
		return fmt.Errorf("run %s: %w: owned by %s (lease %x)", cur.Genesis, ErrNotOwner, cur.Owner, cur.Lease)
	case !cur.To.IsZero():
		return fmt.Errorf("run %s: %w: transferred to %s", cur.Genesis, ErrNotOwner, cur.To)
	}
	return nil
}

func moved(cur Entry, head record.Address, phase record.Phase) error {
	return fmt.Errorf("run %s: %w: directory at %s (%s), claim at %s (%s)", cur.Genesis, ErrHeadMoved, cur.Head, cur.Phase, head, phase)
}

// errUnchanged tells update that the entry is already as wanted, and
// errRemove that it is to be deleted.
var (
	errUnchanged = errors.New("unchanged")
	errRemove    = errors.New("remove")
)

// update reads the run's entry, the lease of its owner's live session and
// this host's, lets decide judge it and say the new entry, and writes it
// in a transaction that compares everything read: the entry's revision,
// the owner's session, and this host's session being this one. A lost race
// reads again; etcd not answering is ErrUnavailable.
//
// A first attempt judged on seen (not nil) skips its read: the
// transaction's comparisons hold it to what a read would have seen.
func (h *Session) update(ctx context.Context, op string, genesis record.Address, seen *Seen,
	decide func(cur Entry, exists bool, ownerLease int64) (Entry, error)) (Entry, error) {
	ctx, cancel := h.bounded(ctx)
	defer cancel()
	rk := h.runKey(genesis)
	for range maxAttempts {
		if err := h.live(); err != nil {
			return Entry{}, fmt.Errorf("%s run %s: %w", op, genesis, err)
		}
		cur, exists, ownerLease, err := h.read(ctx, op, genesis, seen)
		if err != nil {
			return Entry{}, err
		}
		seen = nil
		next, err := decide(cur, exists, ownerLease)
		write := clientv3.OpPut(rk, string(next.encode()))
		switch {
		case err == errUnchanged:
			return cur, nil
		case err == errRemove:
			write = clientv3.OpDelete(rk)
		case err != nil:
			return Entry{}, fmt.Errorf("%s: %w", op, err)
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.LeaseValue(h.aliveKey(h.key)), "=", int64(h.lease)),
			clientv3.Compare(clientv3.ModRevision(rk), "=", cur.Rev),
		}
		if exists && cur.Owner != h.key {
			cmps = append(cmps, clientv3.Compare(clientv3.LeaseValue(h.aliveKey(cur.Owner)), "=", ownerLease))
		}
		r, err := h.cli.Txn(ctx).If(cmps...).Then(write).Commit()
		if err != nil {
			return Entry{}, unavailable(op+" run "+genesis.String(), err)
		}
		if r.Succeeded {
			next.Rev = r.Header.Revision
			return next, nil
		}
	}
	return Entry{}, fmt.Errorf("%s run %s: %w: the entry kept changing", op, genesis, ErrUnavailable)
}

// read returns the run's entry (Rev 0 when it has none), the lease of its
// owner's live session (0 when none), and fails when this host's session
// is not live in etcd, all at one revision.
//
// With seen (not nil, of this genesis), read returns it without a request.
func (h *Session) read(ctx context.Context, op string, genesis record.Address, seen *Seen) (Entry, bool, int64, error) {
	if seen != nil && seen.entry.Genesis == genesis && seen.entry.Rev != 0 {
		lease := seen.ownerLease
		if seen.entry.Owner == h.key {
			lease = int64(h.lease)
		}
		return seen.entry, true, lease, nil
	}
	ops := []clientv3.Op{clientv3.OpGet(h.runKey(genesis)), clientv3.OpGet(h.aliveKey(h.key))}
	r, err := h.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return Entry{}, false, 0, unavailable(op+" run "+genesis.String(), err)
	}
	if l := leaseOf(r.Responses[1]); l != int64(h.lease) {
		err := fmt.Errorf("host %s: %w: etcd holds lease %x, not %x", h.key, ErrLeaseLost, l, int64(h.lease))
		h.end(err)
		return Entry{}, false, 0, fmt.Errorf("%s run %s: %w: %w", op, genesis, ErrNotOwner, err)
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Entry{Genesis: genesis}, false, 0, nil
	}
	cur, err := decodeEntry(genesis, kvs[0].Value, kvs[0].ModRevision)
	if err != nil {
		return Entry{}, false, 0, err
	}
	if cur.Owner == h.key {
		return cur, true, int64(h.lease), nil
	}
	o, err := h.cli.Get(ctx, h.aliveKey(cur.Owner), clientv3.WithRev(r.Header.Revision))
	if err != nil {
		return Entry{}, false, 0, unavailable(op+" run "+genesis.String(), err)
	}
	var ol int64
	if len(o.Kvs) == 1 {
		ol = o.Kvs[0].Lease
	}
	return cur, true, ol, nil
}

func leaseOf(r *etcdserverpb.ResponseOp) int64 {
	if kvs := r.GetResponseRange().Kvs; len(kvs) == 1 {
		return kvs[0].Lease
	}
	return 0
}
