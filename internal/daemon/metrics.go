package daemon

import (
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/metrics"
	"github.com/runrecordd/runrecordd/internal/version"
)

// serviceMetrics sets what the service's metrics read: the build and the
// runtime from the host's facts, the image-park gate, the store.
func (d *Daemon) serviceMetrics() {
	var patches string
	if d.base != nil {
		patches = metrics.PatchNumbers(d.base.CRIU.Patches())
	}
	d.metrics.SetBuild(metrics.Build{Version: version.Get().Version, CRIU: d.host[manifest.CRIUVersion],
		CRIUPatches: patches, Runc: d.host[manifest.RuncVersion], Containerd: d.host[manifest.ContainerdVersion]})
	d.metrics.ServiceFrom(metrics.Service{StoreDir: d.st.Dir(), ImageParks: func() int {
		switch d.probe.Status().State {
		case imageparks.Available:
			return metrics.ImageParksAvailable
		case imageparks.Unavailable:
			return metrics.ImageParksUnavailable
		}
		return metrics.ImageParksProbing
	}})
}
