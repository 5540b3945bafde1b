package daemon

import (
	"context"
	"io"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
)

// Sandboxes is the executor as the daemon consumes it: containerd's
// sandboxes and images. *executor.Client is the production one (through
// execRole); the daemon's unit tests use an in-memory fake, so the
// ordering and refusal logic of run, park, resume and close runs without
// root. e2e proves the real one.
type Sandboxes interface {
	Start(ctx context.Context, id string, spec executor.Spec, out executor.Output) (Sandbox, error)
	Restore(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (Sandbox, executor.RestoreStats, error)
	Load(ctx context.Context, id string) (Sandbox, error)
	List(ctx context.Context) ([]string, error)
	Remove(ctx context.Context, id string) error
	Prune(ctx context.Context) ([]string, error)
	Image(ctx context.Context, name string) (executor.Image, error)
	Import(ctx context.Context, r io.Reader, name string) (executor.Image, error)
	Versions(ctx context.Context) (executor.Versions, error)
	Probe(ctx context.Context, deadline time.Duration) executor.Probe
	SweepProbes(ctx context.Context)
	Close() error
}

// Sandbox is one unit's sandbox as the daemon consumes it
// (*executor.Sandbox). It is also the park's Checkpointer and the
// interval's Sandbox.
type Sandbox interface {
	ID() string
	Pid() uint32
	// Omitted is the output discarded past the unit's log limit so far.
	Omitted() (stdout, stderr uint64)
	Status(ctx context.Context) (string, error)
	// Wait returns the unit's exit code once it exits.
	Wait(ctx context.Context) (uint32, error)
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Settle puts the unit back to running by its task's real state.
	Settle(ctx context.Context) error
	Stats(ctx context.Context) (executor.Usage, error)
	Checkpoint(ctx context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error)
	Destroy(ctx context.Context) error
}

// execRole is *executor.Client as the daemon's Sandboxes.
type execRole struct{ *executor.Client }

func (e execRole) Start(ctx context.Context, id string, spec executor.Spec, out executor.Output) (Sandbox, error) {
	sb, err := e.Client.Start(ctx, id, spec, out)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (e execRole) Restore(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (Sandbox, executor.RestoreStats, error) {
	sb, rs, err := e.Client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		return nil, rs, err
	}
	return sb, rs, nil
}

func (e execRole) Load(ctx context.Context, id string) (Sandbox, error) {
	sb, err := e.Client.Load(ctx, id)
	if err != nil {
		return nil, err
	}
	return sb, nil
}
