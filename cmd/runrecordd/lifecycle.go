package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

func cmdPark(args []string, stdout io.Writer) error {
	v := newVerb("park")
	all := v.fs.Bool("all", false, "park every run executing on the host; the daemon's next start resumes them (docs/daemon.md, \"Stop and start\")")
	parallel := v.fs.Int("parallel", 0, "with --all: how many runs to park at once (default 4)")
	v.withProgress(stdout)
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		switch {
		case *all && len(pos) == 0:
			return parkAll(stdout, v.cf, c, cx, *parallel)
		case *all || len(pos) != 1:
			return usagef("usage: runrecordd park RUN | park --all [--parallel N]")
		}
		pr := v.startProgress(progressEvent{Verb: "park", Run: pos[0]}, 0, false)
		p, err := c.Park(cx, pos[0])
		pr.Done(err)
		if err != nil {
			return err
		}
		return parkTable(stdout, v.cf, pos[0], p)
	})
}

func parkTable(stdout io.Writer, cf clientFlags, id string, p api.Park) error {
	return cf.print(stdout, p, func(w io.Writer) {
		fmt.Fprintf(w, "parked %s in %s\n", id, time.Duration(p.DurationNS).Round(time.Millisecond))
		fmt.Fprintf(w, "snapshot:\t%s\n", p.Snapshot)
		fmt.Fprintf(w, "manifest:\t%s\n", p.Manifest)
		fmt.Fprintf(w, "retained:\t%s\n", bytesString(p.Retained))
		fmt.Fprintf(w, "receipt:\t%s %s (%s)\n", uj(p.Receipt.UJ), p.Receipt.Provenance, p.Receipt.Method)
		if cp := p.Checkpoint; cp != nil {
			fmt.Fprintf(w, "checkpoint:\t%s (dump %s, frozen %s, %d pages written)\n", time.Duration(cp.TotalNS).Round(time.Millisecond),
				time.Duration(cp.DumpNS).Round(time.Millisecond), time.Duration(cp.FrozenNS).Round(time.Millisecond), cp.Pages)
		}
	})
}

func cmdResume(args []string, stdout io.Writer) error {
	v := newVerb("resume")
	var flags listFlag
	v.fs.Var(&flags, "secret", secretUsage)
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		secrets, err := parseSecrets(flags)
		if err != nil {
			return err
		}
		r, err := c.ResumeWith(cx, id, api.ResumeRequest{Secrets: secrets})
		if err != nil {
			return err
		}
		return resumeTable(stdout, v.cf, id, r)
	})
}

func resumeTable(stdout io.Writer, cf clientFlags, id string, r api.Resume) error {
	return cf.print(stdout, r, func(w io.Writer) {
		fmt.Fprintf(w, "resumed %s in %s after %s parked\n", id, time.Duration(r.DurationNS).Round(time.Millisecond), time.Duration(r.ParkedNS).Round(time.Millisecond))
		fmt.Fprintf(w, "idle energy:\t%s %s\n", uj(r.Idle.UJ), r.Idle.Provenance)
		if rs := r.Restore; rs != nil {
			fmt.Fprintf(w, "restore:\t%s\n", restoreString(rs))
		}
	})
}

func cmdClose(args []string, stdout io.Writer) error {
	v := newVerb("close")
	reason := v.fs.String("reason", "", "why (recorded in the Closed segment)")
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		r, err := c.Close(cx, id, *reason)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, r, func(w io.Writer) { runTable(w, []api.Run{r}) })
	})
}

// cmdAdopt is `adopt RUN`: a run whose owner in the fleet is gone, held
// here parked, becomes this host's (docs/fleet.md, "Lost hosts").
func cmdAdopt(args []string, stdout io.Writer) error {
	v := newVerb("adopt")
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		r, err := c.Adopt(cx, id)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, r, func(w io.Writer) { runTable(w, []api.Run{r}) })
	})
}

// cmdMigrate is `migrate RUN --to KEY`: the run moves to the fleet's host
// of that key (docs/fleet.md, "Migration"), parked here first if it runs.
func cmdMigrate(args []string, stdout io.Writer) error {
	v := newVerb("migrate")
	to := v.fs.String("to", "", "the key id of the host to move the run to (`fleet status` lists them)")
	v.withProgress(stdout)
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		if *to == "" {
			return usagef("usage: runrecordd migrate RUN --to KEY")
		}
		p := v.startProgress(progressEvent{Verb: "migrate", Run: id}, 0, false)
		r, err := c.Migrate(cx, id, *to)
		p.Done(err)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, r, func(w io.Writer) {
			fmt.Fprintf(w, "migrated %s to %s; here it is now:\n", id, *to)
			runTable(w, []api.Run{r})
		})
	})
}

// verifyRun is `verify RUN`: the daemon verifies a stored run.
func verifyRun(cf clientFlags, id string, stdout io.Writer) error {
	c, err := cf.client()
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	v, err := c.Verify(cx, id)
	if err != nil {
		return err
	}
	if perr := cf.print(stdout, v, func(w io.Writer) {
		if !v.OK {
			return
		}
		fmt.Fprintf(w, "verified from genesis: %d segments, %s, head %s\n", v.Segments, v.Phase, v.Head)
		fmt.Fprintf(w, "objects: %d rehashed, %s\n", v.Objects, bytesString(v.Bytes))
		if o := v.Owing; v.Owed > 0 && o != nil && o.State == "stranded" {
			fmt.Fprintf(w, "owed: %d slabs from host %s, stranded (not_held): %s; close the run to end it\n", v.Owed, o.Source, o.Reason)
		} else if v.Owed > 0 {
			fmt.Fprintf(w, "owed: %d slabs, a post-copy migration brings them in", v.Owed)
			if o := v.Owing; o != nil {
				fmt.Fprintf(w, " from host %s: %s", o.Source, o.State)
				if o.Reason != "" {
					fmt.Fprintf(w, ": %s", o.Reason)
				}
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "wait proof: %s: %s\n", v.WaitProof.Verdict, v.WaitProof.Reason)
		printSigners(w, v.Signers, true)
	}); perr != nil {
		return perr
	}
	if !v.OK {
		return v.Error
	}
	return nil
}

func cmdWaitProof(args []string, stdout io.Writer) error {
	vb := newVerb("wait-proof")
	return vb.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		v, err := c.WaitProof(cx, id)
		if err != nil {
			return err
		}
		return vb.cf.print(stdout, v, func(w io.Writer) {
			if v.Segment != nil {
				fmt.Fprintf(w, "%s at segment %d: %s\n", v.Verdict, *v.Segment, v.Reason)
				return
			}
			fmt.Fprintf(w, "%s: %s\n", v.Verdict, v.Reason)
		})
	})
}

// cmdDrain is `drain [--to KEY ...] [--parallel N]`: every run off this
// host to the fleet's others, each run's outcome printed as it ends.
func cmdDrain(args []string, stdout io.Writer) error {
	v := newVerb("drain")
	var to listFlag
	v.fs.Var(&to, "to", "a key id of a host to move runs to (repeat; default every other host of the fleet)")
	parallel := v.fs.Int("parallel", 0, "how many runs to move at once (0: the host's default)")
	v.streams(stdout)
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 0 {
			return usagef("usage: runrecordd drain [--to KEY ...] [--parallel N]")
		}
		// Each run's outcome as it ends, from the event stream: on
		// stdout beside the table, with -o json on stderr as the
		// events' JSON lines, stdout keeping its one object, or with
		// -o jsonl as progress events before the result.
		// The drain is asked for once the stream is subscribed, and the
		// stream ends once every run's outcome came (or 2 s after the
		// drain answered), so none is missed.
		ectx, stop := context.WithCancel(cx)
		defer stop()
		progress := &drainProgress{w: stdout, json: v.cf.output == "json", more: make(chan struct{}, 1), start: time.Now()}
		switch v.cf.output {
		case "json":
			progress.w = os.Stderr
		case "jsonl":
			progress.events = v.cf.events
		}
		subscribed, streamed := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(streamed)
			_ = c.Subscribe(ectx, func() { close(subscribed) }, progress.event)
		}()
		select {
		case <-subscribed:
		case <-streamed: // no stream: the drain goes ahead without it
		}
		d, err := c.Drain(cx, api.DrainRequest{To: to, Parallel: *parallel})
		if err == nil {
			progress.wait(len(d.Runs), 2*time.Second)
		}
		stop()
		<-streamed
		if err != nil {
			return err
		}
		if perr := v.cf.print(stdout, d, func(w io.Writer) {
			fmt.Fprintf(w, "drained: %d moved, %d left here\n", d.Moved, d.Left)
			for _, r := range d.Runs {
				if r.Error != nil {
					fmt.Fprintf(w, "  %s\tnot moved: %s (%s)\n", printable(r.Run), printable(r.Error.Message), r.Error.Code)
				}
			}
		}); perr != nil {
			return perr
		}
		if d.Left > 0 {
			return fmt.Errorf("drain: %d runs not moved", d.Left)
		}
		return nil
	})
}

// drainProgress prints each run's outcome of a drain as its event
// arrives: a table line, the event as a JSON line, or with -o jsonl a
// progress event.
type drainProgress struct {
	w      io.Writer
	json   bool
	events *eventLines
	start  time.Time
	// printed counts the drain.run events printed; more, when not nil,
	// has a token after each.
	printed atomic.Int64
	more    chan struct{}
}

func (p *drainProgress) event(e api.Event) bool {
	if e.Kind != "drain.run" {
		return true
	}
	switch {
	case p.events != nil:
		_ = p.events.write(progressEvent{Event: "progress", Verb: "drain", Run: e.Run, Detail: e.Detail, ElapsedNS: int64(time.Since(p.start))})
	case p.json:
		_ = json.NewEncoder(p.w).Encode(e)
	default:
		fmt.Fprintf(p.w, "%s\t%s\n", printable(e.Run), printable(e.Detail))
	}
	p.printed.Add(1)
	if p.more != nil {
		select {
		case p.more <- struct{}{}:
		default:
		}
	}
	return true
}

// wait waits until n drain.run events were printed, or for at most d.
func (p *drainProgress) wait(n int, d time.Duration) {
	deadline := time.After(d)
	for p.printed.Load() < int64(n) {
		select {
		case <-p.more:
		case <-deadline:
			return
		}
	}
}
