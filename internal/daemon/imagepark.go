package daemon

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/host"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/metrics"
	"github.com/runrecordd/runrecordd/internal/version"
)

// probeFor is the image-park gate's probe of ex (imageparks.Start): each
// step under the deadline of a small unit, its findings checked against
// the CRIU build's record (none in unit tests) and the host's
// user-namespace policy (imageparks.UserNS).
func probeFor(ex Sandboxes, build criu.Build, cfg Config) func(context.Context) criu.Probe {
	return func(ctx context.Context) criu.Probe {
		p := imageparks.CheckBuild(ex.Probe(ctx, imageparks.Deadline(cfg.CRIUDeadline, 0)), build)
		return imageparks.UserNS(p, cfg.HostRootImages)
	}
}

// serviceMetrics sets what the service's metrics m read: the build and
// the runtime from host h's facts, the image-park gate, the store.
func serviceMetrics(m *metrics.Metrics, h *host.Host, gate *imageparks.Gate) {
	m.SetBuild(metrics.Build{Version: version.Get().Version, CRIU: h.Facts[manifest.CRIUVersion],
		CRIUPatches: metrics.PatchNumbers(h.CRIU.Patches()), Runc: h.Facts[manifest.RuncVersion], Containerd: h.Facts[manifest.ContainerdVersion]})
	m.ServiceFrom(metrics.Service{StoreDir: h.Store.Dir(), ImageParks: func() int {
		switch gate.Status().State {
		case imageparks.Available:
			return metrics.ImageParksAvailable
		case imageparks.Unavailable:
			return metrics.ImageParksUnavailable
		}
		return metrics.ImageParksProbing
	}})
}
