package forms

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/platform"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Image is the image form: a unit parked as CRIU's images of its process
// tree and its rw layer (internal/park), restored under the same sandbox
// id. Every image park and resume waits on the image-park gate and runs
// under CRIU's deadline.
type Image struct{ h Env }

// Ready waits on the image-park gate: where image parks do not work, an
// image unit is refused.
func (f Image) Ready(ctx context.Context, id string) error {
	if err := f.h.Gate.Ready(ctx); err != nil {
		return fmt.Errorf("run %s: %w (a transcript unit can still run: --mode transcript)", id, err)
	}
	return nil
}

// Start starts run's sandbox under the run's id.
func (f Image) Start(ctx context.Context, run Run) (Woken, error) {
	out, err := f.h.Output(run.ID)
	m := f.h.Mark(run.ID)
	var sb Sandbox
	var es executor.Spec
	if err == nil {
		es, err = f.h.unitSpec(run, f.h.Gate.UserNS(), false)
	}
	if err == nil {
		sb, err = f.h.Sandboxes.Start(ctx, run.ID, es, out)
	}
	if err != nil {
		return Woken{}, err
	}
	return Woken{Unit: &Unit{Run: run, Sandbox: sb}, Event: "started", Mark: m}, nil
}

// Keys are the manifest keys an image park records.
func (Image) Keys() []string { return manifest.ImageKeys }

// Snapshot checkpoints the unit, leaving it frozen, and stores its images
// (internal/park), within the room the run has.
func (f Image) Snapshot(ctx context.Context, u *Unit) (Taken, error) {
	id := u.ID
	if err := f.h.Gate.Ready(ctx); err != nil {
		return Taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	if err := f.awaitPages(ctx, u); err != nil {
		return Taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	release, err := f.h.Gate.Admit(ctx)
	if err != nil {
		return Taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	defer release()
	var mem uint64
	if use, err := u.Sandbox.Stats(ctx); err == nil {
		mem = use.MemoryBytes
	}
	raw, err := f.h.Store.Raw(id)
	if err != nil {
		return Taken{}, err
	}
	room, err := park.Room(f.h.Store, park.Sizing{Run: id, Grants: u.Grants, Memory: mem, Segments: raw.Segments, MinFree: f.h.MinFree})
	if err != nil {
		return Taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	// The link goes before the freeze: nothing the dump does not hold
	// is acknowledged to the outside, and the parked sandbox's end sends
	// nothing when it is destroyed. The outside's packets are dropped
	// meanwhile; its connections go on at the resume.
	if err := f.unlink(u); err != nil {
		return Taken{}, fmt.Errorf("park %s: %w", id, err)
	}
	res, err := park.Image(ctx, f.h.Store, u.Sandbox, park.ImageOptions{Deadline: imageparks.Deadline(f.h.CRIUDeadline, mem), MaxRootfs: room, Base: lastMemory(raw.Segments), Kin: f.kin(u.Run), Run: id})
	if err != nil {
		return Taken{}, errors.Join(fmt.Errorf("park %s: %w", id, err), f.relink(u))
	}
	ck := res.Checkpointed()
	return Taken{Snapshot: res.Snapshot, Retained: res.Retained, Keys: f.Keys(), Details: []attest.Detail{ck}, Checkpoint: &ck}, nil
}

// kin is the kin of run's parks (park.ImageOptions.Kin): the key it is
// booked to, the zero address for the operator's, and its unit's image.
// A run that reads secrets, one whose record ever arrived in a bundle or
// a migration (whoever started it: an import, a move here, a handed-off
// run come back), and one whose book cannot be read have none: their
// parks take no other run's slabs, and give none.
func (f Image) kin(run Run) string {
	if len(run.Grants.Secrets) > 0 {
		return ""
	}
	ret, err := f.h.Store.RetentionOf(run.ID)
	if err == nil && !ret.Imported.IsZero() {
		return ""
	}
	key, berr := platform.Booked(f.h.StateDir, run.ID)
	if err = errors.Join(err, berr); err != nil {
		f.h.Log.Warn("park: sharing no chunks with other runs", "run", run.ID, "err", err)
		return ""
	}
	return key.String() + " " + run.Spec.Image
}

// lastMemory is the memory image of the last image park of segs, if any:
// a chunked park's base (park.ImageOptions.Base). The segments are not
// verified here; the base only says where the park looks for bytes it
// compares.
func lastMemory(segs []record.Segment) *record.Address {
	for i := len(segs) - 1; i >= 0; i-- {
		if m := segs[i].Snapshot.Memory; m != nil {
			return m
		}
	}
	return nil
}

// Thaw settles the unit by its task's real state: CRIU may have left it
// frozen, or not.
func (f Image) Thaw(_ context.Context, u *Unit) error {
	return errors.Join(u.Sandbox.Settle(context.Background()), f.relink(u))
}

// linked says whether a unit under g has a link out (network egress).
func (f Image) linked(g unit.Grants) bool {
	return g.Network == unit.Egress && f.h.Links != nil
}

// unlink removes the link out of u's sandbox, if it has one (network
// egress): its run keeps its rules, translation and tracked connections.
func (f Image) unlink(u *Unit) error {
	if !f.linked(u.Grants) {
		return nil
	}
	return f.h.Links.Unlink(u.ID)
}

// relink links u's sandbox, which goes on after a refused park, out
// again: into the network namespace of its unit's init.
func (f Image) relink(u *Unit) error {
	if !f.linked(u.Grants) {
		return nil
	}
	link, err := f.h.Links.Link(u.ID, u.Grants.Egress, false)
	if err == nil {
		err = link("/proc/" + strconv.FormatUint(uint64(u.Sandbox.Pid()), 10) + "/ns/net")
	}
	if err == nil {
		err = f.h.Links.Pass(u.ID) // not a restore: nothing closed
	}
	if err != nil {
		return fmt.Errorf("link run %s out again: %w", u.ID, err)
	}
	return nil
}

// Wake restores the run's images once the gate lets it and the parked
// sandbox is gone (its id is the restore's).
func (f Image) Wake(ctx context.Context, run Run, w Waking) (Woken, error) {
	if w.Snapshot.IsTranscript() {
		return Woken{}, fmt.Errorf("resume %s: %w", run.ID, ErrFormMismatch)
	}
	if err := f.h.Gate.Ready(ctx); err != nil {
		return Woken{}, fmt.Errorf("resume %s: %w", run.ID, err)
	}
	if w.Teardown != nil {
		select {
		case <-w.Teardown: // the parked sandbox is gone; its id is free
		case <-ctx.Done():
			return Woken{}, ctx.Err()
		}
	}
	release, err := f.h.Gate.Admit(ctx)
	if w.Asked != nil {
		w.Asked()
	}
	if err != nil {
		return Woken{}, fmt.Errorf("resume %s: %w", run.ID, err)
	}
	defer release()
	deadline := imageparks.Deadline(f.h.CRIUDeadline, uint64(w.Retained))
	if w.Owed != nil {
		// Owed pages come over the peer link, not from the disk.
		deadline += time.Duration(w.Owed.Bytes()/owedRate) * time.Second
	}
	return f.restore(ctx, run, w, deadline)
}

// RestoreDir is where, under the state directory, each image restore lays
// its trees out (RestoreDir/RUN), removed once the restore returns; a
// start removes what a crash left (daemon reconcile).
const RestoreDir = "restore"

// owedRate is the bytes a second a lazy restore's deadline allows for
// each owed slab's (docs/fleet.md, "Post-copy").
const owedRate = 8 << 20

// restore lays the snapshot's trees out of the store and restores the
// sandbox from them.
func (f Image) restore(ctx context.Context, run Run, w Waking, deadline time.Duration) (Woken, error) {
	id := run.ID
	t0 := time.Now()
	dir := filepath.Join(f.h.StateDir, RestoreDir, id)
	if err := os.RemoveAll(dir); err != nil {
		return Woken{}, err
	}
	defer os.RemoveAll(dir)
	trees, served, err := f.layout(w.Snapshot, dir, w.Lazy, w.Owed)
	if err != nil {
		return Woken{}, err
	}
	laid := time.Since(t0)
	out, err := f.h.Output(id)
	if err != nil {
		return Woken{}, err
	}
	es, err := f.h.unitSpec(run, f.h.resumeUserNS(trees.ImageDir), true)
	if err != nil {
		return Woken{}, fmt.Errorf("resume %s: %w", id, err)
	}
	m := f.h.Mark(id)
	cp := executor.Checkpoint{ImageDir: trees.ImageDir, Rootfs: trees.Rootfs, Deadline: deadline, Pages: served}
	sb, rs, pg, err := f.restoreSandbox(ctx, restoring{id: id, spec: es, cp: cp, out: out, start: t0, lazy: w.Lazy})
	if err != nil {
		return Woken{}, fmt.Errorf("resume %s: %w", id, err)
	}
	// Its link holds the outside's packets: the daemon passes it once
	// the resume's interval journals what the pass closes.
	st := &attest.Restored{TotalNS: int64(time.Since(t0)), MaterializeNS: int64(laid), RootfsNS: int64(rs.Rootfs),
		TaskNS: int64(rs.Task), ForkingNS: int64(rs.Forking), RestoreNS: int64(rs.Restore), Pages: rs.PagesRestored, Lazy: pg != nil, Served: pg != nil && served != nil}
	return Woken{Unit: &Unit{Run: run, Sandbox: sb, pages: pg}, Event: attest.EventRestored, Mark: m,
		Details: []attest.Detail{*st}, Restored: st}, nil
}

// layout lays the snapshot's trees out under dir: for a lazy restore,
// with the manifest its page server serves the pages by, each chunk
// verified as it is served (Admit rehashed the rest: park.OfferedServed),
// and each of a slab still owed fetched first (owed).
func (f Image) layout(snap record.Snapshot, dir string, lazy bool, owed park.Owed) (park.Trees, *pageserver.Table, error) {
	if lazy && f.h.Lazy != nil && f.h.LazyServed {
		return park.LayoutServedOwed(f.h.Store, snap, dir, owed)
	}
	t, err := park.Layout(f.h.Store, snap, dir)
	return t, nil, err
}

// Reattached settles a unit found not stopped: a park the last daemon did
// not finish may have left it frozen, or held by a CRIU that outlived the
// daemon. A unit whose lazy restore no daemon saw finish (LazyUnfinished)
// is left as found, frozen if the last daemon froze it for its lost
// pages: the daemon parks it back. An image unit is never recovered.
func (f Image) Reattached(ctx context.Context, u *Unit, status string) (bool, error) {
	if status == "stopped" || f.h.LazyUnfinished(u) {
		return false, nil
	}
	if err := u.Sandbox.Settle(ctx); err != nil {
		return false, err
	}
	if status == "paused" || status == "pausing" {
		f.h.Log.Info("reconcile: thawed a unit whose park did not complete", "run", u.ID)
	}
	return false, nil
}

// Recover is never asked of an image unit (Reattached says so).
func (f Image) Recover(context.Context, *Unit, *record.Snapshot) (Taken, error) {
	return Taken{}, fmt.Errorf("an image unit is not recovered from disk")
}

// resumeUserNS says whether the park whose CRIU images are in dir resumes
// in a user namespace (where the host runs units in them): as it was
// made, in one if it was made in one; a park made without one resumes as
// the host's root only where the host accepts it (HostRootImages), and
// elsewhere in one, where the judge refuses it (image_refused, naming
// userns).
func (h Env) resumeUserNS(dir string) bool {
	return executor.ImagesUserNS(dir) || !h.HostRootImages
}
