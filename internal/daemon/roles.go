package daemon

import (
	"context"
	"io"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
)

// Sandboxes is the executor as the daemon consumes it: containerd's
// sandboxes and images, with the forms' start and restore
// (forms.Sandboxes). *executor.Client is the production one (through
// forms.Exec); the daemon's unit tests use an in-memory fake, so the
// ordering and refusal logic of run, park, resume and close runs without
// root. e2e proves the real one.
type Sandboxes interface {
	forms.Sandboxes
	forms.Sweeper
	Load(ctx context.Context, id string) (Sandbox, error)
	Import(ctx context.Context, r io.Reader, name string) (executor.Image, error)
	Probe(ctx context.Context, deadline time.Duration) criu.Probe
}

// Sandbox is one unit's sandbox as the daemon and its forms consume it
// (*executor.Sandbox; forms.Sandbox).
type Sandbox = forms.Sandbox
