package forms

import (
	"context"
	"log/slog"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Sweeper is what clearing sandboxes needs of the executor: the ids of
// its sandboxes, removing one, and pruning what gone sandboxes left.
type Sweeper interface {
	List(ctx context.Context) ([]string, error)
	Remove(ctx context.Context, id string) error
	Prune(ctx context.Context) ([]string, error)
}

// Sweep decides, after a restart, which sandbox each executing run keeps
// (PlanSandboxes, phase reading a run's phase), removes every other one,
// prunes the executor's leftovers, and returns the plan. A sandbox whose
// run cannot be read is left; one not removed is retried at the next
// start.
func Sweep(ctx context.Context, sb Sweeper, phase func(run string) (record.Phase, error), log *slog.Logger) (Plan, error) {
	ids, err := sb.List(ctx)
	if err != nil {
		return Plan{}, err
	}
	plan := PlanSandboxes(ids, phase)
	for _, u := range plan.Unread {
		log.Error("reconcile: cannot read the run of a sandbox; leaving it", "sandbox", u.Sandbox, "err", u.Err)
	}
	for _, sid := range plan.Remove {
		Remove(ctx, sb, sid, "reconcile: removing a sandbox no executing run owns", log)
	}
	if pruned, err := sb.Prune(ctx); err != nil {
		log.Warn("reconcile: pruning the executor's leftovers", "err", err)
	} else if len(pruned) > 0 {
		log.Info("reconcile: removed network namespaces of sandboxes that are gone", "sandboxes", pruned)
	}
	return plan, nil
}

// Remove removes sandbox sid, logging why; one not removed is logged, and
// the next start's Sweep retries it.
func Remove(ctx context.Context, sb Sweeper, sid, why string, log *slog.Logger) {
	log.Info(why, "sandbox", sid, "run", RunOf(sid))
	if err := sb.Remove(ctx, sid); err != nil {
		log.Error("sandbox not removed; the next start retries", "sandbox", sid, "err", err)
	}
}

// RemoveRun removes every sandbox of run id the executor still has,
// whatever state it is in: the run's record no longer needs them
// (closed). It takes up to a minute, whether or not ctx ends first.
func RemoveRun(ctx context.Context, sb Sweeper, id string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	ids, err := sb.List(ctx)
	if err != nil {
		log.Error("listing sandboxes; the next start removes what is left", "run", id, "err", err)
		return
	}
	for _, sid := range ids {
		if RunOf(sid) == id {
			Remove(ctx, sb, sid, "removing a sandbox of a closed run", log)
		}
	}
}
