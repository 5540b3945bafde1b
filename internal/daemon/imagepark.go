package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/imageparks"
)

// startProbe starts the image-park gate's probe, each step under the
// deadline of a small unit, its findings checked against the CRIU build's
// record and the host's user-namespace policy (imageparks.UserNS); a CRIU
// that did not tell its version (criuErr) is not probed.
func (d *Daemon) startProbe(criuErr error) {
	var build criu.Build // none without a host (unit tests)
	if d.base != nil {
		build = d.base.CRIU
	}
	probe := func(ctx context.Context) criu.Probe {
		p := imageparks.CheckBuild(d.ex.Probe(ctx, imageparks.Deadline(d.cfg.CRIUDeadline, 0)), build)
		return imageparks.UserNS(p, d.cfg.HostRootImages)
	}
	d.probe = imageparks.Start(d.bgCtx, &d.bg, probe, criuErr, d.log)
	d.forms.Gate = d.probe
}
