package daemon

import (
	"context"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/imageparks"
)

// criuDeadline is the deadline of a dump or restore that moves memBytes of
// memory (imageparks.Deadline).
func (d *Daemon) criuDeadline(memBytes uint64) time.Duration {
	return imageparks.Deadline(d.cfg.CRIUDeadline, memBytes)
}

// startProbe starts the image-park gate's probe, each step under the
// deadline of a small unit; a CRIU that did not tell its version
// (criuErr) is not probed.
func (d *Daemon) startProbe(criuErr error) {
	probe := func(ctx context.Context) executor.Probe { return d.ex.Probe(ctx, d.criuDeadline(0)) }
	d.probe = imageparks.Start(d.bgCtx, &d.bg, probe, criuErr, d.log)
}
