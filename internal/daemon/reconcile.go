package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// reconcile makes containerd's sandboxes agree with the records after a
// restart: a run executing in its record gets its sandbox back (thawed if a
// park froze it and did not finish); a sandbox whose run is parked or
// closed — or that no run owns — is destroyed.
//
// In a fleet the directory is reconciled first (reconcileFleet): a run
// executing here that another host has now loses its sandbox here, with
// no append.
func (d *Daemon) reconcile(ctx context.Context) error {
	var elsewhere map[string]bool
	if d.session() != nil {
		var err error
		if elsewhere, err = d.fleet.Reconcile(ctx); err != nil {
			return fmt.Errorf("fleet: %w", err)
		}
	}
	// No channel outlives the daemon that served it: every journal spool
	// found now is a dead interval's (its account is lost with it).
	if err := os.RemoveAll(filepath.Join(d.cfg.StateDir, "spool")); err != nil {
		d.log.Warn("reconcile: removing the journal spools of the last daemon", "err", err)
	}
	ids, err := d.ex.List(ctx)
	if err != nil {
		return err
	}
	// Each executing run keeps one sandbox: its own id, or for a transcript
	// run the latest interval's (an earlier one is a teardown that did
	// not finish).
	owner := map[string]string{}
	unsure := map[string]bool{} // runs whose record could not be read
	for _, sid := range ids {
		run := runOf(sid)
		st, err := d.st.Run(run)
		switch {
		case err != nil && !errors.Is(err, store.ErrNoRun):
			unsure[run] = true
			d.log.Error("reconcile: cannot read the run of a sandbox; leaving it", "sandbox", sid, "err", err)
		case err == nil && st.Phase == record.Active && newer(sid, owner[run]):
			owner[run] = sid
		}
	}
	for _, sid := range ids {
		if owner[runOf(sid)] == sid || unsure[runOf(sid)] {
			continue
		}
		d.log.Info("reconcile: removing a sandbox no executing run owns", "sandbox", sid, "run", runOf(sid))
		if err := d.ex.Remove(ctx, sid); err != nil {
			d.log.Error("reconcile: sandbox not removed; the next start retries", "sandbox", sid, "err", err)
		}
	}
	if pruned, err := d.ex.Prune(ctx); err != nil {
		d.log.Warn("reconcile: pruning the executor's leftovers", "err", err)
	} else if len(pruned) > 0 {
		d.log.Info("reconcile: removed network namespaces of sandboxes that are gone", "sandboxes", pruned)
	}
	active, err := d.st.Runs(record.Active)
	if err != nil {
		return err
	}
	for _, id := range active {
		if elsewhere[id] && owner[id] != "" {
			d.log.Warn("reconcile: removing the sandbox of a run another host of the fleet has", "run", id, "sandbox", owner[id])
			if err := d.ex.Remove(ctx, owner[id]); err != nil {
				d.log.Error("reconcile: sandbox not removed; the next start retries", "sandbox", owner[id], "err", err)
			}
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

// newer reports whether sandbox a is a later interval's than b ("" is
// older than anything).
func newer(a, b string) bool {
	if b == "" {
		return true
	}
	return suffixN(a) > suffixN(b)
}

func suffixN(sid string) int64 {
	loc := transcriptSuffix.FindStringIndex(sid)
	if loc == nil {
		return 0
	}
	n, _ := strconv.ParseInt(sid[loc[0]+2:], 10, 64)
	return n
}

// reattachRun takes an executing run's sandbox back after a restart.
func (d *Daemon) reattachRun(ctx context.Context, id, sid string) error {
	st, err := d.st.Run(id)
	if err != nil {
		return err
	}
	spec, grants, err := d.unitOf(st)
	if err != nil {
		return err
	}
	sb, err := d.ex.Load(ctx, sid)
	if err != nil {
		return err
	}
	status, _ := sb.Status(ctx)
	if spec.Mode == unit.TranscriptMode && status != "stopped" {
		// Its channel went with the daemon that served it: park it from
		// the transcript on disk, unaccounted. (A unit that exited
		// meanwhile is closed by its watcher below, unaccounted too.)
		if err := d.recoverTranscript(ctx, id, d.reattach(id, sb, spec, grants)); err != nil {
			d.destroy(&live{sb: sb})
			return err
		}
		d.log.Warn("reconcile: parked a transcript unit whose channel did not survive the restart (its interval is unaccounted)", "run", id)
		return nil
	}
	if status != "stopped" {
		// A park the last daemon did not finish may have left the unit
		// frozen, or held by a CRIU that outlived the daemon: settled
		// by its real state.
		if err := sb.Settle(ctx); err != nil {
			return err
		}
		if status == "paused" || status == "pausing" {
			d.log.Info("reconcile: thawed a unit whose park did not complete", "run", id)
		}
	}
	r := d.lock(id)
	defer r.mu.Unlock()
	lv := d.reattach(id, sb, spec, grants)
	r.live = lv
	d.saveMark(id, lv)
	d.watch(id, r, lv)
	d.log.Info("reconcile: reattached", "run", id)
	return nil
}

// removeSandboxes removes every sandbox of run id that containerd still
// has, whatever state it is in. The caller holds the run's lock, and the
// run's record no longer needs them (closed).
func (d *Daemon) removeSandboxes(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	ids, err := d.ex.List(ctx)
	if err != nil {
		d.log.Error("listing sandboxes; the next reconcile removes what is left", "run", id, "err", err)
		return
	}
	for _, sid := range ids {
		if runOf(sid) != id {
			continue
		}
		d.log.Info("removing a sandbox of a closed run", "run", id, "sandbox", sid)
		if err := d.ex.Remove(ctx, sid); err != nil {
			d.log.Error("sandbox not removed; the next reconcile retries", "sandbox", sid, "err", err)
		}
	}
}

// sandboxID is the sandbox of a transcript run's interval n. Each interval
// of a transcript run gets its own sandbox id, so the next interval's
// sandbox can start while the last one is still being torn down. An image
// run's sandbox is the run id: its restore takes the place of the one
// checkpointed.
func sandboxID(run string, n int64) string { return fmt.Sprintf("%s_t%d", run, n) }

var transcriptSuffix = regexp.MustCompile(`_t[0-9]+$`)

// runOf is the run a sandbox belongs to.
func runOf(sid string) string {
	if loc := transcriptSuffix.FindStringIndex(sid); loc != nil {
		return sid[:loc[0]]
	}
	return sid
}
