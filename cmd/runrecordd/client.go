package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"text/tabwriter"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// clientFlags are the flags every client verb takes.
type clientFlags struct {
	socket string
	output string
	// events, for a verb that streams (verb.streams), writes -o jsonl's
	// lines on its standard output; nil, the verb refuses -o jsonl.
	events *eventLines
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	def := os.Getenv("RUNRECORDD_SOCKET")
	if def == "" {
		def = api.DefaultSocket
	}
	fs.StringVar(&c.socket, "socket", def, "the daemon's socket (or RUNRECORDD_SOCKET)")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
}

func (c *clientFlags) client() (*api.Client, error) {
	switch {
	case c.output == "jsonl" && c.events == nil:
		return nil, usagef("-o jsonl: only %s stream events; use table or json", streamingVerbs)
	case c.output == "jsonl":
	case c.events != nil && c.output != "table" && c.output != "json":
		return nil, usagef("-o %s: use table, json or jsonl", c.output)
	default:
		if err := checkOutput(c.output); err != nil {
			return nil, err
		}
	}
	return api.NewClient(c.socket), nil
}

// streamingVerbs are the verbs that take -o jsonl (verb.streams).
const streamingVerbs = "export, import, images import, park, migrate and drain"

// print writes v as JSON with -o json, as a result event with -o jsonl,
// else calls table.
func (c *clientFlags) print(w io.Writer, v any, table func(w io.Writer)) error {
	if c.output == "jsonl" {
		return c.events.write(resultEvent{Event: "result", Result: v})
	}
	return printAs(w, c.output, v, table)
}

// resultEvent is -o jsonl's last line when the verb succeeded: what -o
// json prints, as Result.
type resultEvent struct {
	Event  string `json:"event"` // "result"
	Result any    `json:"result"`
}

// errorEvent is -o jsonl's last line when the verb failed: the API's error
// body (its code absent for a failure on this side of the socket but bad
// usage, bad_request), and the exit status.
type errorEvent struct {
	Event string `json:"event"` // "error"
	*api.Error
	Exit int `json:"exit"`
}

func newErrorEvent(err error) errorEvent {
	e := errorEvent{Event: "error", Error: &api.Error{Message: err.Error()}, Exit: exitCode(err)}
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		e.Error = ae
	case e.Exit == 2:
		e.Error.Code = api.CodeBadRequest
	}
	return e
}

// eventLines writes -o jsonl's events: one JSON object a line, whole
// lines whichever goroutine writes.
type eventLines struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *eventLines) write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.w.Write(append(b, '\n'))
	return err
}

// checkOutput refuses an -o other than table or json.
func checkOutput(output string) error {
	if output != "table" && output != "json" {
		return usagef("-o %s: use table or json", output)
	}
	return nil
}

// printAs writes v as one indented JSON value when output is json, else
// calls table with a tabwriter over w.
func printAs(w io.Writer, output string, v any, table func(w io.Writer)) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// parse parses fs over args allowing flags after the positional arguments
// (`show RUN -o json`), and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseFlags is fs.Parse with its errors as usage errors (exit 2); the
// flag package has already printed the flag's usage.
//
// While flagSink is set (verbFlags), it is handed fs instead, and the verb
// ends there with flag.ErrHelp: every verb's flags are declared before it
// parses them, so this is how help, completion and the man page read them.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if flagSink != nil {
		flagSink(fs)
		return flag.ErrHelp
	}
	err := fs.Parse(args)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return usageError{msg: err.Error(), printed: true}
	}
	return err
}

func ctx() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// verb is what every client verb shares: the client flags beside its own,
// positional arguments anywhere among the flags, a client and a context
// that ^C ends.
type verb struct {
	name string
	fs   *flag.FlagSet
	cf   clientFlags
	pf   *progressFlags // withProgress
}

func newVerb(name string) *verb {
	v := &verb{name: name, fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	v.cf.register(v.fs)
	return v
}

// streams lets v take -o jsonl: its progress events, then its result or
// error, one JSON object a line on out (its standard output).
func (v *verb) streams(out io.Writer) {
	v.cf.events = &eventLines{w: out}
	v.fs.Lookup("o").Usage = "output: table, json, or jsonl (progress events, then the result or the error, one JSON object a line)"
}

// withProgress gives v --progress and --progress-every, and -o jsonl.
func (v *verb) withProgress(out io.Writer) {
	v.streams(out)
	v.pf = &progressFlags{}
	v.pf.register(v.fs)
}

// run parses args and calls fn with the positional arguments, a client and
// a context. With -o jsonl, fn's error is written as an error event too.
func (v *verb) run(args []string, fn func(pos []string, c *api.Client, cx context.Context) error) error {
	pos, err := parse(v.fs, args)
	if err != nil {
		return err
	}
	c, err := v.cf.client()
	if err != nil {
		return err
	}
	if v.pf != nil {
		if err := v.pf.check(); err != nil {
			return err
		}
	}
	cx, cancel := ctx()
	defer cancel()
	err = fn(pos, c, cx)
	if err != nil && v.cf.output == "jsonl" {
		_ = v.cf.events.write(newErrorEvent(err))
	}
	return err
}

// runOne is run for a verb that takes one run.
func (v *verb) runOne(args []string, fn func(id string, c *api.Client, cx context.Context) error) error {
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 1 {
			return usagef("usage: runrecordd %s RUN", v.name)
		}
		return fn(pos[0], c, cx)
	})
}

// openInput opens path, or standard input for "-".
func openInput(path string) (io.ReadCloser, error) {
	if path == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	return os.Open(path)
}

// exitCode is the exit status for a failed verb (see the usage text).
func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) || errors.Is(err, flag.ErrHelp) || errors.Is(err, errTerminal) {
		return 2
	}
	var ae *api.Error
	if !errors.As(err, &ae) {
		return 1
	}
	switch ae.Code {
	case api.CodeBadRequest:
		return 2
	case api.CodeDaemonUnreachable:
		return 3
	case api.CodeNotFound:
		return 4
	case api.CodePhase, api.CodeConflict, api.CodeExists, api.CodeHandedOff, api.CodeGenesisHeld, api.CodeSnapshotMismatch, api.CodeManifestMismatch,
		api.CodeRecordInvalid, api.CodeObjectCorrupt, api.CodeMissingObject, api.CodeCallRefused, api.CodeSecretsRequired,
		api.CodeUntrustedSigner, api.CodeGrantRefused, api.CodeImageRefused, api.CodeBundleLimit, api.CodeForbidden, api.CodeQuota, api.CodeNotOwner,
		api.CodeNotHeld:
		return 5
	}
	return 1
}
