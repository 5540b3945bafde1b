package fleet

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Adopt makes this host the owner of a lost host's run, at head and phase:
// the entry must exist (ErrNoRun), be owned by another key (ErrNotOwner: a
// run this key owns, under any session, is never adopted — a handoff this
// host made is taken back by its own means, `import --reclaim` or the
// migration's take-back), not be in a transfer (ErrNotOwner), and its
// owner's lease must be gone, read in the same transaction that writes
// (ErrNotOwner while it lives); its head and phase must be head and phase
// (ErrHeadMoved: the lost host went on past them). Claim is the general
// case; Adopt is the one an operator's `adopt` may make.
func (h *Session) Adopt(ctx context.Context, genesis record.Address, run string, head record.Address, phase record.Phase) (Entry, error) {
	if err := checkName(run); err != nil {
		return Entry{}, err
	}
	return h.update(ctx, "adopt", genesis, nil, func(cur Entry, exists bool, ownerLease int64) (Entry, error) {
		switch {
		case !exists:
			return Entry{}, fmt.Errorf("run %s: %w: no lost host owned it", genesis, ErrNoRun)
		case cur.Owner == h.key:
			return Entry{}, fmt.Errorf("run %s: %w: this host's own run is not adopted (take a handoff back with import --reclaim)", genesis, ErrNotOwner)
		case !cur.To.IsZero():
			return Entry{}, fmt.Errorf("run %s: %w: transferred to %s; that host claims it", genesis, ErrNotOwner, cur.To)
		case ownerLease == cur.Lease:
			return Entry{}, fmt.Errorf("run %s: %w: %s (lease %x alive)", genesis, ErrNotOwner, cur.Owner, cur.Lease)
		case cur.Head != head || cur.Phase != phase:
			return Entry{}, moved(cur, head, phase)
		}
		next := cur
		next.Run, next.Owner, next.Lease = run, h.key, int64(h.lease)
		return next, nil
	})
}
