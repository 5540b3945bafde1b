package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

func cmdCalls(args []string, stdout io.Writer) error {
	v := newVerb("calls")
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 0 {
			return usagef("usage: runrecordd calls")
		}
		cs, err := c.Calls(cx)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, cs, func(w io.Writer) {
			fmt.Fprintln(w, "RUN\tPHASE\tCALL\tKIND\tRESULT\tPAYLOAD")
			for _, x := range cs {
				res := "awaited"
				if x.ResultPosted {
					res = "posted"
				}
				var p bytes.Buffer
				if json.Compact(&p, x.Payload) != nil {
					p.Write(x.Payload)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(x.Run), x.Phase, printable(x.ID), printable(x.Kind), res, printable(p.String()))
			}
		})
	})
}

func cmdPost(args []string, stdout io.Writer) error {
	v := newVerb("post")
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 3 {
			return usagef("usage: runrecordd post RUN CALL RESULT (a JSON value; - reads standard input)")
		}
		payload := []byte(pos[2])
		if pos[2] == "-" {
			var err error
			if payload, err = io.ReadAll(os.Stdin); err != nil {
				return err
			}
		}
		if !json.Valid(payload) {
			return usagef("the result %q is not JSON (quote a string: '\"ok\"')", strings.TrimSpace(string(payload)))
		}
		pr, err := c.PostResult(cx, pos[0], pos[1], payload)
		if err != nil {
			return err
		}
		if perr := v.cf.print(stdout, pr, func(w io.Writer) {
			fmt.Fprintf(w, "posted the result of %s to %s\n", printable(pr.Call), printable(pr.Run))
			switch {
			case pr.Resumed != nil:
				fmt.Fprintf(w, "it was the last one awaited: resumed in %s, idle %s %s\n",
					time.Duration(pr.Resumed.DurationNS).Round(time.Millisecond), uj(pr.Resumed.Idle.UJ), pr.Resumed.Idle.Provenance)
			case len(pr.Awaiting) > 0:
				fmt.Fprintf(w, "still awaiting: %s\n", printable(strings.Join(pr.Awaiting, ", ")))
			}
		}); perr != nil {
			return perr
		}
		if pr.ResumeError != nil {
			return fmt.Errorf("the result is kept, but the run could not resume: %w", pr.ResumeError)
		}
		return nil
	})
}

func cmdWatch(args []string, stdout io.Writer) error {
	v := newVerb("watch")
	run := v.fs.String("run", "", "only this run's transitions")
	until := v.fs.String("until", "", "stop after the first event of this kind (e.g. run.closed)")
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 0 {
			return usagef("usage: runrecordd watch [--run RUN] [--until KIND]")
		}
		enc := json.NewEncoder(stdout)
		return c.Events(cx, func(e api.Event) bool {
			if *run != "" && e.Run != *run {
				return true
			}
			if v.cf.output == "json" {
				_ = enc.Encode(e)
			} else {
				fmt.Fprintf(stdout, "%s  %-16s %s %s %s\n", e.Time.Format(time.RFC3339Nano), e.Kind, printable(e.Run), printable(e.Call), printable(e.Detail))
			}
			if f, ok := stdout.(*os.File); ok {
				_ = f.Sync()
			}
			return *until == "" || e.Kind != *until
		})
	})
}
