package forms

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/executor"
)

// Gone is sandbox id whose unit no longer runs and whose task containerd
// no longer has (a unit that died while no daemon watched it: containerd,
// restarting, drops a task with no process). It stands in for the
// sandbox while the daemon records what became of its run: its status is
// stopped, its wait returns at once, it cannot be frozen, thawed or
// checkpointed, and Destroy removes what is left of it with remove.
func Gone(id string, remove func(ctx context.Context, id string) error) Sandbox {
	return gone{id: id, remove: remove}
}

type gone struct {
	id     string
	remove func(ctx context.Context, id string) error
}

func (g gone) ID() string                           { return g.id }
func (gone) Pid() uint32                            { return 0 }
func (gone) Omitted() (stdout, stderr uint64)       { return 0, 0 }
func (gone) Status(context.Context) (string, error) { return "stopped", nil }
func (gone) Wait(context.Context) (uint32, error)   { return 137, nil }
func (g gone) Pause(context.Context) error          { return g.exited() }
func (g gone) Resume(context.Context) error         { return g.exited() }
func (g gone) Settle(context.Context) error         { return g.exited() }
func (gone) Kill(context.Context) error             { return nil }
func (g gone) Destroy(ctx context.Context) error    { return g.remove(ctx, g.id) }
func (g gone) Stats(context.Context) (executor.Usage, error) {
	return executor.Usage{}, g.exited()
}
func (g gone) Checkpoint(context.Context, executor.Checkpoint) (executor.CheckpointStats, error) {
	return executor.CheckpointStats{}, g.exited()
}

func (g gone) exited() error { return fmt.Errorf("sandbox %s: %w", g.id, executor.ErrExited) }
