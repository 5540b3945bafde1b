package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Fence appends to a store's records only as far as the fleet lets this
// host: every advance is reserved in etcd first ([Session.Advance]), then
// made in bbolt, and taken back in etcd ([Session.Revert]) when bbolt does
// not make it (docs/fleet.md, "The order of the two writes"). It is the
// store the daemon and its interval room append through when the host is
// in a fleet; every other store call passes through to Store.
type Fence struct {
	*store.Store
	Session *Session
}

// Reservation is an advance etcd confirmed and the store has not made
// yet: a resume holds one while it restores the unit.
type Reservation struct {
	f             *Fence
	run           string
	genesis, prev record.Address
	next          record.Address
	segs          []record.Segment
}

// Next is the head the reservation advances the run to.
func (r *Reservation) Next() record.Address { return r.next }

// Reserve judges segs against run's record at head, as the store will
// (a refusal here reserves nothing), and reserves the advance they make in
// etcd: ErrNotOwner, ErrHeadMoved or ErrUnavailable when the fleet does
// not confirm it.
func (f *Fence) Reserve(ctx context.Context, run string, head record.Address, segs ...record.Segment) (*Reservation, error) {
	st, err := f.Store.Run(run)
	if err != nil {
		return nil, err
	}
	if st.Head != head {
		return nil, fmt.Errorf("run %s: %w: at %s, not %s", run, store.ErrHeadMoved, st.Head, head)
	}
	chain := record.NewChain(st.State())
	next := head
	for i := range segs {
		if next, err = chain.Append(&segs[i]); err != nil {
			return nil, fmt.Errorf("run %s: %w", run, err)
		}
	}
	r := &Reservation{f: f, run: run, genesis: record.Genesis(st.Unit, st.Grants), prev: head, next: next, segs: segs}
	if _, err := f.Session.Advance(ctx, r.genesis, head, next, chain.State().Phase); err != nil {
		return nil, fmt.Errorf("run %s: %w", run, err)
	}
	return r, nil
}

// Append makes the reserved advance in the store. Refused there, the
// reservation is taken back; a take-back etcd cannot confirm is joined to
// the error, and the host's next claim at the record's head takes it back
// (docs/fleet.md).
func (r *Reservation) Append(ctx context.Context) (record.Address, error) {
	head, err := r.f.Store.AppendAll(r.run, r.prev, r.segs...)
	if err != nil {
		return record.Address{}, errors.Join(err, r.Cancel(ctx))
	}
	return head, nil
}

// Cancel takes the reservation back, as a resume whose restore failed
// does.
func (r *Reservation) Cancel(ctx context.Context) error {
	if _, err := r.f.Session.Revert(ctx, r.genesis, r.next); err != nil {
		return fmt.Errorf("run %s: taking back the advance to %s: %w", r.run, r.next, err)
	}
	return nil
}

// AppendAll reserves and appends in one, as [store.Store.AppendAll] does
// alone: a park, a close and a unit's exit append this way, once their
// evidence is sealed and before the sandbox goes.
func (f *Fence) AppendAll(run string, head record.Address, segs ...record.Segment) (record.Address, error) {
	ctx := context.Background()
	r, err := f.Reserve(ctx, run, head, segs...)
	if err != nil {
		return record.Address{}, err
	}
	return r.Append(ctx)
}
