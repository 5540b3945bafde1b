package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// reconcile makes containerd's sandboxes agree with the records after a
// restart: a run executing in its record gets its sandbox back (thawed if a
// park froze it and did not finish); a sandbox whose run is parked or
// closed — or that no run owns — is destroyed.
//
// In a fleet the directory is reconciled first (member.Reconcile): a run
// executing here that another host has now loses its sandbox here, with
// no append.
func (d *Daemon) reconcile(ctx context.Context) error {
	var elsewhere map[string]bool
	if d.fleet.Session() != nil {
		var err error
		if elsewhere, err = d.fleet.Reconcile(ctx); err != nil {
			return fmt.Errorf("fleet: %w", err)
		}
		if err := d.fleet.GoOn(); err != nil {
			d.log.Warn("fleet: the post-copy migrations under way at the last stop do not go on", "err", err)
		}
	}
	// No channel outlives the daemon that served it: every journal spool
	// found now is a dead interval's (its account is lost with it).
	if err := os.RemoveAll(filepath.Join(d.cfg.StateDir, "spool")); err != nil {
		d.log.Warn("reconcile: removing the journal spools of the last daemon", "err", err)
	}
	// Each executing run keeps one sandbox: its own id, or for a transcript
	// run the latest interval's (forms.Sweep).
	plan, err := forms.Sweep(ctx, d.ex, func(run string) (record.Phase, error) {
		st, err := d.st.Run(run)
		return st.Phase, err
	}, d.log)
	if err != nil {
		return err
	}
	owner := plan.Owner
	if d.base != nil {
		releaseRanges(d.base.Ranges, d.st, owner, d.log)
	}
	sweepSecrets(d.secrets, d.st, d.log)
	if d.links != nil {
		// One a crash left does not keep the daemon from starting: a
		// later link of its slot replaces it.
		if err := d.links.sweep(d.st); err != nil {
			d.log.Error("reconcile: egress links no run holds not all removed", "err", err)
		}
	}
	active, err := d.st.Runs(record.PhaseExecuting)
	if err != nil {
		return err
	}
	for _, id := range active {
		if elsewhere[id] {
			if owner[id] != "" {
				forms.Remove(ctx, d.ex, owner[id], "reconcile: removing the sandbox of a run another host of the fleet has", d.log)
			}
			continue
		}
		if owner[id] == "" {
			// Not known to be gone: its unit may run under another
			// containerd (a changed --containerd-address).
			d.log.Warn("reconcile: run is executing in its record but has no sandbox here (lost); close it or resume it elsewhere", "run", id)
			continue
		}
		// One run that cannot be taken back is reported lost; it does not
		// keep the daemon from starting.
		if err := d.reattachRun(ctx, id, owner[id]); err != nil {
			d.log.Error("reconcile: the run is lost until closed", "run", id, "sandbox", owner[id], "err", err)
		}
	}
	removeRestoreTrees(ctx, d.ex, d.runs, d.cfg.StateDir, d.log)
	return nil
}

// removeRestoreTrees removes the trees a killed daemon's restores left
// under forms.RestoreDir: hard links to stored objects, which would keep
// their bytes past a collection, or a pages file written from chunks. It
// runs after the sweep, which killed any restore still running in a
// shim, and leaves the tree of a run with any sandbox still here (one the
// sweep kept: executing, its record unread, or its removal failed; a
// lazy restore's pages may still be read from it). Under the run's lock:
// at a fleet's rejoin a resume may be under way, and removes its own tree
// when it returns.
func removeRestoreTrees(ctx context.Context, ex forms.Sweeper, runs *runTable, stateDir string, log *slog.Logger) {
	root := filepath.Join(stateDir, forms.RestoreDir)
	ents, err := os.ReadDir(root)
	if err != nil {
		if !os.IsNotExist(err) {
			log.Warn("reconcile: reading the restore trees", "err", err)
		}
		return
	}
	if len(ents) == 0 {
		return
	}
	ids, err := ex.List(ctx)
	if err != nil {
		log.Warn("reconcile: the restore trees are kept: listing the sandboxes", "err", err)
		return
	}
	kept := map[string]bool{}
	for _, sid := range ids {
		kept[forms.RunOf(sid)] = true
	}
	for _, e := range ents {
		id := e.Name()
		if kept[id] {
			continue
		}
		r := runs.lock(id)
		err := os.RemoveAll(filepath.Join(root, id))
		r.mu.Unlock()
		if err != nil {
			log.Warn("reconcile: removing a restore tree the last daemon left", "run", id, "err", err)
		}
	}
}

// reattachRun takes an executing run's sandbox back after a restart.
func (d *Daemon) reattachRun(ctx context.Context, id, sid string) error {
	run, err := runOf(d.st, id)
	if err != nil {
		return err
	}
	sb, err := d.ex.Load(ctx, sid)
	if errors.Is(err, executor.ErrNotFound) {
		// containerd keeps the container but no task: the unit died
		// while no daemon watched it (with the host or with containerd,
		// or killed by the last daemon for its lost pages).
		return d.takeBackGone(ctx, run, forms.Gone(sid, d.ex.Remove))
	}
	if err != nil {
		return err
	}
	status, _ := sb.Status(ctx)
	u := forms.Orphan(run, sb)
	// A unit the last daemon's park may have left frozen is settled; one
	// whose channel went with that daemon is parked from what it left on
	// disk, unaccounted (its form says which).
	orphaned, err := d.forms.For(run.Spec.Mode).Reattached(ctx, u, status)
	if err != nil {
		return err
	}
	if orphaned {
		if err := d.recoverUnit(ctx, id, d.intervals.reattach(id, u)); err != nil {
			(&live{sb: sb}).destroy(d.log)
			return err
		}
		d.log.Warn("reconcile: parked a transcript unit whose channel did not survive the restart (its interval is unaccounted)", "run", id)
		return nil
	}
	r := d.runs.lock(id)
	defer r.mu.Unlock()
	lv := d.intervals.reattach(id, u)
	r.live = lv
	if d.forms.LazyUnfinished(u) {
		if named, _ := d.parkBackResumed(id, r, lv, unfinishedLoss(lv.iv.Events())); named {
			if r.live == nil {
				return nil // parked back
			}
			d.watch(id, r, lv) // the park back's append refused: a close ends it
			return nil
		}
	}
	if at, ok := d.forms.LazySettled(u); ok {
		journalSettled(lv.iv, at)
	}
	d.intervals.SaveMark(lv.iv)
	if d.links != nil && run.Grants.Network == unit.Egress {
		// A resume's pass the last daemon did not make (docs/unit.md,
		// egress).
		ns := "/proc/" + strconv.FormatUint(uint64(sb.Pid()), 10) + "/ns/net"
		if err := d.links.Reheld(id, run.Grants.Egress, ns, lv.iv.Events()); err != nil {
			d.log.Error("reconcile: the unit's link out not passed", "run", id, "err", err)
		}
	}
	d.watch(id, r, lv)
	d.log.Info("reconcile: reattached", "run", id)
	return nil
}

// runOf is run id as its record in st says: its unit and grants.
func runOf(st *store.Store, id string) (forms.Run, error) {
	r, err := st.Run(id)
	if err != nil {
		return forms.Run{}, err
	}
	spec, grants, err := st.ReadRun(r)
	if err != nil {
		return forms.Run{}, err
	}
	return forms.Run{ID: id, Spec: spec, Grants: grants}, nil
}

// goneReason is why a unit found gone at a start was lost.
const goneReason = "the unit was gone when the daemon started (its container kept, no task) and no daemon saw it end"

// errUnitLost is a unit found gone at a start.
var errUnitLost = errors.New(goneReason)

// takeBackGone records what became of executing run whose unit a
// starting daemon found gone: containerd has its sandbox sb's container
// but no task (forms.Gone). An image run goes back to the snapshot it
// resumed from (parkBackResumed), its interval journaling unit-lost, or
// pages-lost where its lazy restore was unfinished; a transcript run is
// parked at the transcript it left, unaccounted (recoverUnit), its
// interval journaling unit-lost. An image run that never parked has no
// snapshot to go back to: it stays executing in its record, lost, as
// does one whose park back was refused (the next start tries again); the
// returned error says which.
func (d *Daemon) takeBackGone(ctx context.Context, run forms.Run, sb forms.Sandbox) error {
	id := run.ID
	u := forms.Orphan(run, sb)
	lost := attest.LifecycleOf(time.Now().UnixNano(), attest.UnitLost{Reason: goneReason})
	if run.Spec.Mode == unit.TranscriptMode {
		lv := d.intervals.reattach(id, u)
		lv.iv.Journal(lost)
		if err := d.recoverUnit(ctx, id, lv); err != nil {
			return err
		}
		d.log.Warn("reconcile: parked a transcript run whose unit was gone (its interval is unaccounted)", "run", id)
		return nil
	}
	r := d.runs.lock(id)
	defer r.mu.Unlock()
	lv := d.intervals.reattach(id, u)
	r.live = lv
	l := loss{how: attest.UnitLost{Reason: goneReason}, err: errUnitLost}
	if d.forms.LazyUnfinished(u) {
		l = unfinishedLoss(lv.iv.Events())
	} else if at, ok := d.forms.LazySettled(u); ok {
		journalSettled(lv.iv, at)
	}
	named, parked := d.parkBackResumed(id, r, lv, l)
	if !parked {
		r.live = nil
		if !named {
			return fmt.Errorf("%w, and its record names no snapshot it resumed from", errUnitLost)
		}
		return fmt.Errorf("%w; its park back was not recorded", errUnitLost)
	}
	return nil
}
