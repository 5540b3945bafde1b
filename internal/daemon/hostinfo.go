package daemon

import (
	"context"
	"io"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/manifest"
)

// Host describes this daemon's host.
func (d *Daemon) Host() HostInfo {
	h := HostInfo{KeyID: d.keyID, StateDir: d.cfg.StateDir, Embedded: d.ctrd != nil, Containerd: d.cfg.ContainerdAddress,
		Manifest: manifest.Manifest{}, Meter: d.meter.Snapshot(), ImageParks: d.probe.Status()}
	if d.ctrd != nil {
		h.Containerd = d.ctrd.Address()
	}
	for k, v := range d.host {
		h.Manifest[k] = v
	}
	return h
}

// ImportImage imports an OCI or docker image archive.
func (d *Daemon) ImportImage(ctx context.Context, r io.Reader, name string) (executor.Image, error) {
	return d.ex.Import(ctx, r, name)
}
