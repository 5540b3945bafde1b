package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// parseBytes reads 512Mi, 1G, 1048576.
func parseBytes(s string) (uint64, error) {
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		m      uint64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.m
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size (e.g. 512Mi, 1G, 1048576)", s)
	}
	return n * mult, nil
}

func cmdRun(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	id := fs.String("id", "", "the run's id (default: made up)")
	mode := fs.String("mode", "image", "how the unit parks: image or transcript")
	cpu := fs.Uint("cpu", 0, "CPU limit in thousandths of a core (0: unlimited)")
	mem := fs.String("memory", "0", "memory limit, e.g. 512Mi; 0 is the daemon's default, 1 GiB (there is no unlimited; docs/limits.md)")
	network := fs.String("network", "none", "network: none or loopback")
	var env, ro listFlag
	fs.Var(&env, "env", "KEY=VALUE for the unit (repeatable)")
	fs.Var(&ro, "ro", "SRC:DST read-only bind mount (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usagef("usage: runrecordd run [flags] IMAGE [ARGS...]")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	m, err := unit.ParseMode(*mode)
	if err != nil {
		return usagef("--mode: %v", err)
	}
	n, err := unit.ParseNetwork(*network)
	if err != nil {
		return usagef("--network: %v", err)
	}
	mb, err := parseBytes(*mem)
	if err != nil {
		return usagef("--memory: %v", err)
	}
	req := api.RunRequest{ID: *id,
		Unit:   unit.Spec{Image: fs.Arg(0), Args: fs.Args()[1:], Env: env, Mode: m},
		Grants: unit.Grants{MilliCPU: uint32(*cpu), MemoryBytes: mb, Network: n}}
	for _, r := range ro {
		src, dst, ok := strings.Cut(r, ":")
		if !ok {
			return usagef("--ro %s: use SRC:DST", r)
		}
		req.Grants.ReadOnly = append(req.Grants.ReadOnly, unit.Mount{Source: src, Target: dst})
	}
	cx, cancel := ctx()
	defer cancel()
	run, err := c.Start(cx, req)
	if err != nil {
		return err
	}
	return cf.print(stdout, run, func(w io.Writer) { runTable(w, []api.Run{run}) })
}

func runTable(w io.Writer, runs []api.Run) {
	fmt.Fprintln(w, "RUN\tSTATUS\tSEGMENTS\tIMAGE\tHEAD")
	for _, r := range runs {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", printable(r.ID), r.Status, r.Segments, printable(r.Image), r.Head)
	}
}

func cmdList(args []string, stdout io.Writer) error {
	v := newVerb("list")
	phase := v.fs.String("phase", "", "only runs in this phase: executing, parked or closed")
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 0 {
			return usagef("usage: runrecordd list [--phase PHASE]")
		}
		runs, err := c.List(cx, *phase)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, runs, func(w io.Writer) { runTable(w, runs) })
	})
}
