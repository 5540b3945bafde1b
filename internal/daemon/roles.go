package daemon

import (
	"context"
	"io"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
)

// Sandboxes is the executor as the daemon consumes it: containerd's
// sandboxes and images, with the forms' start and restore
// (forms.Sandboxes). *executor.Client is the production one (through
// execRole); the daemon's unit tests use an in-memory fake, so the
// ordering and refusal logic of run, park, resume and close runs without
// root. e2e proves the real one.
type Sandboxes interface {
	forms.Sandboxes
	forms.Sweeper
	Load(ctx context.Context, id string) (Sandbox, error)
	Import(ctx context.Context, r io.Reader, name string) (executor.Image, error)
	Probe(ctx context.Context, deadline time.Duration) executor.Probe
}

// Sandbox is one unit's sandbox as the daemon and its forms consume it
// (*executor.Sandbox; forms.Sandbox).
type Sandbox = forms.Sandbox

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
