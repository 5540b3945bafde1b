package forms

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Sandbox is one unit's sandbox (*executor.Sandbox). It is also the
// park's Checkpointer and the interval's Sandbox.
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
	// Kill ends the unit's processes, keeping its sandbox for Destroy.
	Kill(ctx context.Context) error
	Destroy(ctx context.Context) error
}

// Sandboxes is what the forms make sandboxes with: containerd's start
// of a fresh one and its restore of a checkpoint (*executor.Client), and
// the image a unit names, as imported here (a manifest records its digest).
type Sandboxes interface {
	Image(ctx context.Context, name string) (executor.Image, error)
	Start(ctx context.Context, id string, spec executor.Spec, out executor.Output) (Sandbox, error)
	Restore(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (Sandbox, executor.RestoreStats, error)
}

// Linker links runs' sandboxes out as their egress grants allow (the
// daemon, over internal/egress): Link holds a link for run on this host,
// until the run closes or leaves, and returns how to link a sandbox's
// network namespace to it (executor.Spec.Link); Unlink removes run's link
// from its sandbox (a park), keeping the rest. A link made after an
// Unlink holds the outside's packets for the sandbox until Pass, which
// follows its restore (or its thaw). ResolvConf is the host file every
// linked sandbox has as its /etc/resolv.conf (ResolvTarget), made if it
// is missing.
type Linker interface {
	// Link is how to link a sandbox of run out under allow; restore
	// says the sandbox is a restore's (its sockets come back after).
	Link(run string, allow []unit.Dest, restore bool) (func(netns string) error, error)
	Unlink(run string) error
	// Pass lets the outside's packets through to run's sandbox linked
	// again (a refused park's). A restore's pass is the daemon's, once
	// the interval that journals what it closes is open.
	Pass(run string) error
	ResolvConf() (string, error)
}

// Exec is *executor.Client in the roles its consumers declare — the
// forms' Sandboxes, the daemon's, the sweep's — with its sandboxes as a
// Sandbox: the production implementation of each.
type Exec struct{ *executor.Client }

func (e Exec) Start(ctx context.Context, id string, spec executor.Spec, out executor.Output) (Sandbox, error) {
	sb, err := e.Client.Start(ctx, id, spec, out)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (e Exec) Restore(ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output) (Sandbox, executor.RestoreStats, error) {
	sb, rs, err := e.Client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		return nil, rs, err
	}
	return sb, rs, nil
}

// Load is the sandbox id containerd has.
func (e Exec) Load(ctx context.Context, id string) (Sandbox, error) {
	sb, err := e.Client.Load(ctx, id)
	if err != nil {
		return nil, err
	}
	return sb, nil
}
