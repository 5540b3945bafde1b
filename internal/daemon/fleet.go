package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
)

// The daemon's part in a fleet is the member room (internal/fleet/member): the
// session, the fence every append goes through, reconciling with the
// directory, migrations, adoption, drains and the lease's guard. The
// daemon gives it its run table (fleetRuns) and its runs as its operations
// hold them (heldRun).

// Placement: before a drain moves anything, each host it may move runs to
// says what it can take (drain.Local.Offer, over the peer routes: the
// daemon wires its drain.Local once, Rooms.Placement), and the drain
// judges each run against each offer (drain.Fit) — so an image run is
// never sent to a host whose manifest its resume would refuse, nor to one
// without room for it (docs/fleet.md, "Drain"; internal/fleet/drain).

// digestOf is the digest of the image ex imported under a name
// (drain.Local.Digest).
func digestOf(ex Sandboxes) func(ctx context.Context, name string) (string, error) {
	return func(ctx context.Context, name string) (string, error) {
		img, err := ex.Image(ctx, name)
		return img.Digest, err
	}
}

// fleetRuns is the daemon's run table as the member room holds its runs.
type fleetRuns struct{ d *Daemon }

func (t fleetRuns) Hold(id string, fresh bool) (member.Held, func(), error) {
	var r *run
	if fresh {
		r = t.d.runs.lock(id)
	} else {
		var err error
		if r, err = t.d.runs.lockRun(id); err != nil {
			return nil, nil, err
		}
	}
	return heldRun{t.d, id, r}, r.mu.Unlock, nil
}

// heldRun is a run as the member room holds it: its lock held.
type heldRun struct {
	d  *Daemon
	id string
	r  *run
}

func (h heldRun) Executing() bool { return h.r.live != nil }

func (h heldRun) Need(ctx context.Context) (drain.Need, error) {
	var mem drain.Memory
	if h.r.live != nil {
		sb := h.r.live.sb
		mem = func(ctx context.Context) (uint64, error) {
			u, err := sb.Stats(ctx)
			return u.MemoryBytes, err
		}
	}
	return h.d.place.Need(ctx, h.id, mem)
}

func (h heldRun) Park(ctx context.Context) error {
	_, err := h.d.park(ctx, h.id, h.r)
	return err
}

func (h heldRun) Resume(ctx context.Context) error {
	_, err := h.d.resume(ctx, h.id, h.r, nil)
	return err
}

// Idle holds every run in the table that no operation holds, one after
// another.
func (t fleetRuns) Idle(fn func(id string, h member.Held)) {
	for id, r := range t.d.runs.all() {
		if r.mu.TryLock() {
			fn(id, heldRun{t.d, id, r})
			r.mu.Unlock()
		}
	}
}

func (h heldRun) Freeze(ctx context.Context) (func(context.Context), error) {
	lv := h.r.live
	if lv == nil {
		return nil, nil
	}
	if err := lv.sb.Pause(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) {
		h.r.mu.Lock()
		defer h.r.mu.Unlock()
		if h.r.live == lv {
			if err := lv.sb.Settle(ctx); err != nil {
				h.d.log.Error("fleet: a frozen unit not thawed", "sandbox", lv.sb.ID(), "err", err)
			}
		}
	}, nil
}

func (h heldRun) Drop() {
	if lv := h.r.live; lv != nil {
		lv.stopping = true
		lv.destroy(h.d.log)
		h.r.live = nil
		h.d.log.Warn("fleet: another host took the run while this one was cut off; its sandbox here is gone, nothing appended", "run", h.id)
	}
}
