package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// parkAll is `park --all`: every run executing on the host parked, each
// run's outcome printed; an error when any run goes on executing.
func parkAll(stdout io.Writer, cf clientFlags, c *api.Client, cx context.Context, parallel int) error {
	p, err := c.ParkAll(cx, api.ParkAllRequest{Parallel: parallel})
	if err != nil {
		return err
	}
	if perr := cf.print(stdout, p, func(w io.Writer) {
		fmt.Fprintf(w, "parked: %d; not parked: %d\n", p.Parked, p.Left)
		for _, r := range p.Runs {
			switch {
			case r.Park != nil && r.Error == nil:
				fmt.Fprintf(w, "  %s\tparked in %s (%s)\n", printable(r.Run), time.Duration(r.Park.DurationNS).Round(time.Millisecond), r.Park.Run.Status)
			case r.Park != nil:
				fmt.Fprintf(w, "  %s\tparked, but the next start will not resume it: %s (%s)\n", printable(r.Run), printable(r.Error.Message), r.Error.Code)
			default:
				fmt.Fprintf(w, "  %s\tnot parked: %s (%s)\n", printable(r.Run), printable(r.Error.Message), r.Error.Code)
			}
		}
	}); perr != nil {
		return perr
	}
	if p.Left > 0 {
		return fmt.Errorf("park --all: %d runs not parked", p.Left)
	}
	return nil
}
