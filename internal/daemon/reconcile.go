package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
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
		if elsewhere[id] && owner[id] != "" {
			forms.Remove(ctx, d.ex, owner[id], "reconcile: removing the sandbox of a run another host of the fleet has", d.log)
			continue
		}
		if owner[id] == "" {
			d.log.Warn("reconcile: run is executing in its record but has no sandbox here (lost); close it or resume it elsewhere", "run", id)
			continue
		}
		// One run that cannot be taken back is reported lost; it does not
		// keep the daemon from starting.
		if err := d.reattachRun(ctx, id, owner[id]); err != nil {
			d.log.Error("reconcile: the run is lost until closed", "run", id, "sandbox", owner[id], "err", err)
		}
	}
	return nil
}

// reattachRun takes an executing run's sandbox back after a restart.
func (d *Daemon) reattachRun(ctx context.Context, id, sid string) error {
	st, err := d.st.Run(id)
	if err != nil {
		return err
	}
	spec, grants, err := d.st.ReadRun(st)
	if err != nil {
		return err
	}
	run := forms.Run{ID: id, Spec: spec, Grants: grants}
	sb, err := d.ex.Load(ctx, sid)
	if errors.Is(err, executor.ErrNotFound) {
		// A unit whose lazy restore no daemon saw finish, killed by the
		// last daemon for its lost pages (its sandbox kept, with the
		// records that say so), is parked back all the same.
		if gone := forms.Gone(sid, d.ex.Remove); d.forms.LazyUnfinished(forms.Orphan(run, gone)) {
			sb, err = gone, nil
		}
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
	if d.forms.LazyUnfinished(u) && d.parkBackUnfinished(id, r, lv) {
		if r.live == nil {
			return nil // parked back
		}
		d.watch(id, r, lv) // the park back's append refused: a close ends it
		return nil
	}
	d.intervals.SaveMark(lv.iv)
	if d.links != nil && grants.Network == unit.Egress {
		// A resume's pass the last daemon did not make (docs/unit.md,
		// egress).
		ns := "/proc/" + strconv.FormatUint(uint64(sb.Pid()), 10) + "/ns/net"
		if err := d.links.Reheld(id, grants.Egress, ns, lv.iv.Events()); err != nil {
			d.log.Error("reconcile: the unit's link out not passed", "run", id, "err", err)
		}
	}
	d.watch(id, r, lv)
	d.log.Info("reconcile: reattached", "run", id)
	return nil
}
