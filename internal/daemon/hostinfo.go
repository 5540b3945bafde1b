package daemon

import (
	"context"
	"io"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/executor"
)

// Host describes this daemon's host ([host.Host.Info]).
func (d *Daemon) Host() answers.HostInfo { return d.base.Info(d.probe.Status()) }

// ImportImage imports an OCI or docker image archive.
func (d *Daemon) ImportImage(ctx context.Context, r io.Reader, name string) (executor.Image, error) {
	return d.ex.Import(ctx, r, name)
}
