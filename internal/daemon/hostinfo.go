package daemon

import (
	"context"
	"io"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
)

// Host describes this daemon's host ([host.Host.Info]), the runs it
// holds for post-copy targets, each ending at the latest HoldLife after
// it was made or last read, and the runs that owe it slabs.
func (d *Daemon) Host() answers.HostInfo {
	h := d.base.Info(d.probe.Status())
	hs, err := d.st.Holds()
	if err != nil {
		d.log.Warn("host: the post-copy holds are not listed", "err", err)
	}
	for _, x := range hs {
		h.Holds = append(h.Holds, answers.Hold{Run: x.Run, Target: x.Target, Head: x.Head, Since: x.Since, Ends: x.Since.Add(member.HoldLife)})
	}
	ows, err := d.fleet.Owings()
	if err != nil {
		d.log.Warn("host: the post-copy owings are not listed", "err", err)
	}
	for _, x := range ows {
		h.Owings = append(h.Owings, owingOf(x))
	}
	return h
}

// owingOf is x as the answers carry it.
func owingOf(x member.OwingRun) answers.Owing {
	return answers.Owing{Run: x.Run, Source: x.Source, Head: x.Head, Slabs: x.Slabs, State: string(x.State), Reason: x.Reason, Tried: x.Tried}
}

// ImportImage imports an OCI or docker image archive.
func (d *Daemon) ImportImage(ctx context.Context, r io.Reader, name string) (executor.Image, error) {
	return d.ex.Import(ctx, r, name)
}
