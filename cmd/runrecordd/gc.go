package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

func cmdGC(args []string, stdout io.Writer) error {
	v := newVerb("gc")
	retention := v.fs.Duration("retention", 0, "release the image snapshots of runs closed longer ago than this (default: the daemon's --snapshot-retention; 0s releases every unpinned closed run's)")
	grace := v.fs.Duration("grace", 0, "remove objects no record reaches once older than this (default 1h; shorter can remove what a park or import in flight is about to name)")
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 0 {
			return usagef("usage: runrecordd gc [--retention DURATION] [--grace DURATION]")
		}
		var keep, g *time.Duration
		v.fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "retention":
				keep = retention
			case "grace":
				g = grace
			}
		})
		out, err := c.GC(cx, keep, g)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, out, func(w io.Writer) {
			for _, id := range out.Released {
				fmt.Fprintf(w, "released the image snapshots of %s\n", printable(id))
			}
			fmt.Fprintf(w, "removed %d objects (%s); %d kept (%s)\n", out.Removed, bytesString(out.RemovedBytes), out.Kept, bytesString(out.KeptBytes))
		})
	})
}

func cmdPin(args []string, stdout io.Writer) error   { return pinVerb("pin", true, args, stdout) }
func cmdUnpin(args []string, stdout io.Writer) error { return pinVerb("unpin", false, args, stdout) }

func pinVerb(name string, pin bool, args []string, stdout io.Writer) error {
	v := newVerb(name)
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		r, err := c.Pin(cx, id, pin)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, r, func(w io.Writer) { runTable(w, []api.Run{r}) })
	})
}
