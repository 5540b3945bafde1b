package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

const logsUsage = "usage: runrecordd logs [-f] [--tail N] [--since T] [--label] RUN"

func cmdLogs(args []string, stdout io.Writer) error {
	v := newVerb("logs")
	follow := v.fs.Bool("f", false, "follow: go on printing new output until the run is closed or handed off (^C ends)")
	tail := v.fs.Int("tail", api.TailAll, "print the last N lines only (-1: all)")
	sinceFlag := v.fs.String("since", "", "leave out sealed intervals' output recorded before T: an RFC 3339 time, or a duration back from now (10m)")
	label := v.fs.Bool("label", false, "begin each line with its interval and stream (\"2 stdout| \")")
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 1 {
			return usagef("%s", logsUsage)
		}
		o := api.LogOptions{Follow: *follow, Tail: *tail}
		if *tail < api.TailAll {
			return usagef("--tail %d: use a count of lines, or -1 for all", *tail)
		}
		if *sinceFlag != "" {
			t, err := sinceTime(*sinceFlag, time.Now())
			if err != nil {
				return usagef("--since %s: use an RFC 3339 time or a duration such as 10m", *sinceFlag)
			}
			o.Since = t
		}
		p := logPrinter{out: stdout, err: os.Stderr, label: *label, json: v.cf.output == "json"}
		return c.Logs(cx, pos[0], o, p.print)
	})
}

// sinceTime is the instant v names: an RFC 3339 time, or a duration back
// from now.
func sinceTime(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("not a time")
	}
	return now.Add(-d), nil
}

// logPrinter prints a run's output: stdout's to out and stderr's to err,
// as the unit wrote it (escaped when it goes to a terminal: a unit's
// bytes must not drive the operator's terminal), marks of output left out
// to err; with -o json, every line as the API sends it, to out.
type logPrinter struct {
	out, err io.Writer
	label    bool
	json     bool
	midLine  [2]bool // the stream's last piece did not end its line
}

func (p *logPrinter) print(l api.LogLine) bool {
	if p.json {
		_ = json.NewEncoder(p.out).Encode(l)
		return true
	}
	w, i := p.out, 0
	if l.Stream == "stderr" {
		w, i = p.err, 1
	}
	if l.Reason != "" {
		fmt.Fprintf(p.err, "runrecordd logs: interval %d %s: %d bytes left out (%s)\n", l.Interval, l.Stream, l.Omitted, l.Reason)
		return true
	}
	b := l.Data()
	if isTerminal(w) {
		b = []byte(printableText(string(b)))
	}
	if p.label && !p.midLine[i] {
		fmt.Fprintf(w, "%d %s| ", l.Interval, l.Stream)
	}
	p.midLine[i] = len(b) > 0 && b[len(b)-1] != '\n'
	_, err := w.Write(b)
	return err == nil
}
