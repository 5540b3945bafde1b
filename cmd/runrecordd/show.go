package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

func uj(v uint64) string {
	return fmt.Sprintf("%s J", strconv.FormatFloat(float64(v)/1e6, 'f', 6, 64))
}

func cmdShow(args []string, stdout io.Writer) error {
	v := newVerb("show")
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		s, err := c.Show(cx, id)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, s, func(w io.Writer) { showTable(w, s) })
	})
}

func showTable(w io.Writer, s api.Show) {
	fmt.Fprintf(w, "run:\t%s\n", s.Run.ID)
	fmt.Fprintf(w, "status:\t%s\n", s.Run.Status)
	if s.Unit != nil {
		fmt.Fprintf(w, "unit:\t%s (%s mode)\n", strings.Join(append([]string{s.Unit.Image}, s.Unit.Args...), " "), s.Unit.Mode)
	}
	fmt.Fprintf(w, "unit id:\t%s\n", s.Run.Unit)
	fmt.Fprintf(w, "grants id:\t%s\n", s.Run.Grants)
	fmt.Fprintf(w, "head:\t%s (%d segments)\n", s.Run.Head, s.Run.Segments)
	fmt.Fprintf(w, "energy:\tactive %s (%s) + idle %s (%s) = cost %s\n",
		uj(s.Totals.ActiveUJ), s.Totals.ActiveProvenance, uj(s.Totals.IdleUJ), s.Totals.IdleProvenance, uj(s.Totals.CostUJ))
	wp := s.WaitProof.Verdict
	if s.WaitProof.Segment != nil {
		wp += fmt.Sprintf(" (segment %d)", *s.WaitProof.Segment)
	}
	fmt.Fprintf(w, "wait proof:\t%s: %s\n", wp, s.WaitProof.Reason)
	if s.Restore != nil {
		fmt.Fprintf(w, "restore:\t%s\n", restoreString(s.Restore))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "#\tKIND\tDETAIL")
	for _, g := range s.Segments {
		var d string
		switch g.Kind {
		case "executed":
			d = fmt.Sprintf("interval %d, %s, %s", g.Interval, g.End.Sub(*g.Start).Round(time.Millisecond), g.Outcome)
			if g.Receipt != nil {
				d += fmt.Sprintf(", receipt %s %s (cpu %s)", uj(g.Receipt.UJ), g.Receipt.Provenance, time.Duration(g.CPUNS).Round(time.Microsecond))
			}
			if g.Calls != nil {
				d += printable(fmt.Sprintf(", calls dispatched %v resolved %v", g.Calls.Dispatched, g.Calls.Resolved))
			}
			if cp := g.Checkpoint; cp != nil {
				d += fmt.Sprintf("\n\t\tcheckpoint %s: freezing %s, frozen %s, memory dump %s, write %s, %d pages written, image %s, rootfs %s",
					time.Duration(cp.TotalNS).Round(time.Millisecond), time.Duration(cp.FreezingNS), time.Duration(cp.FrozenNS).Round(time.Microsecond),
					time.Duration(cp.MemDumpNS).Round(time.Microsecond), time.Duration(cp.MemWriteNS).Round(time.Microsecond), cp.Pages,
					bytesString(cp.ImageBytes), bytesString(cp.RootBytes))
			}
			if rs := g.Restore; rs != nil {
				d += "\n\t\trestore " + restoreString(rs)
			}
		case "suspended":
			d = fmt.Sprintf("%s, manifest %s", g.Snapshot, g.Manifest)
		case "resumed":
			d = fmt.Sprintf("%s park, idle %s %s", g.Form, uj(g.Idle.UJ), g.Idle.Provenance)
		case "closed":
			d = printable(g.Reason)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\n", g.Index, g.Kind, d)
	}
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// restoreString is a restore's time to running and pages restored; for a
// lazy one, "lazy" ("lazy, served" with a page server), then its time to
// every page resident (or the pages lost, or still arriving).
func restoreString(rs *api.Restore) string {
	s := fmt.Sprintf("%s (%d pages restored)", time.Duration(rs.TotalNS).Round(time.Millisecond), rs.Pages)
	if !rs.Lazy {
		return s
	}
	s += ", lazy"
	if rs.Served {
		s += ", served"
	}
	switch {
	case rs.PagesLost != "":
		s += printable(": pages lost (" + rs.PagesLost + ")")
	case rs.ResidentNS > 0:
		s += fmt.Sprintf(": every page resident at %s", time.Duration(rs.ResidentNS).Round(time.Millisecond))
	default:
		s += ": pages still arriving"
	}
	return s
}
