package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// clientFlags are the flags every client verb takes.
type clientFlags struct {
	socket string
	output string
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
	if c.output != "table" && c.output != "json" {
		return nil, usagef("-o %s: use table or json", c.output)
	}
	return api.NewClient(c.socket), nil
}

// print writes v as JSON with -o json, else calls table.
func (c *clientFlags) print(w io.Writer, v any, table func(w io.Writer)) error {
	if c.output == "json" {
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
func parseFlags(fs *flag.FlagSet, args []string) error {
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
}

func newVerb(name string) *verb {
	v := &verb{name: name, fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	v.cf.register(v.fs)
	return v
}

// run parses args and calls fn with the positional arguments, a client and
// a context.
func (v *verb) run(args []string, fn func(pos []string, c *api.Client, cx context.Context) error) error {
	pos, err := parse(v.fs, args)
	if err != nil {
		return err
	}
	c, err := v.cf.client()
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	return fn(pos, c, cx)
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

func cmdImages(args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "import" {
		return usagef("usage: runrecordd images import FILE [--name NAME]")
	}
	v := newVerb("images import")
	name := v.fs.String("name", "", "name to give the image (default: the archive's own)")
	return v.run(args[1:], func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 1 {
			return usagef("usage: runrecordd images import FILE [--name NAME] (FILE - reads standard input)")
		}
		r, err := openInput(pos[0])
		if err != nil {
			return err
		}
		defer r.Close()
		img, err := c.ImportImage(cx, r, *name)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, img, func(w io.Writer) {
			fmt.Fprintf(w, "NAME\tDIGEST\n%s\t%s\n", img.Name, img.Digest)
		})
	})
}

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
	mem := fs.String("memory", "0", "memory limit, e.g. 512Mi (0: unlimited)")
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

func cmdPark(args []string, stdout io.Writer) error {
	v := newVerb("park")
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		p, err := c.Park(cx, id)
		if err != nil {
			return err
		}
		return parkTable(stdout, v.cf, id, p)
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
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		r, err := c.Resume(cx, id)
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
			fmt.Fprintf(w, "restore:\t%s (%d pages restored)\n", time.Duration(rs.TotalNS).Round(time.Millisecond), rs.Pages)
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

func cmdExport(args []string, stdout io.Writer) error {
	v := newVerb("export")
	file := v.fs.String("f", "-", "write the bundle to this file (- for standard output)")
	handoff := v.fs.Bool("handoff", true, "hand the run off: this host will not resume or close it until a bundle extending it is imported back (false: export a copy, which no host resumes)")
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		export := c.Export
		if !*handoff {
			export = c.ExportCopy
		}
		if *file == "-" {
			return export(cx, id, stdout)
		}
		// Whole and durable, so a failed export leaves no half bundle
		// under the name, and a finished one survives a crash.
		return atomicfile.Write(*file, 0o600, func(f *os.File) error { return export(cx, id, f) })
	})
}

func cmdImport(args []string, stdout io.Writer) error {
	v := newVerb("import")
	id := v.fs.String("id", "", "store the run under this id (default: the bundle's)")
	reclaim := v.fs.Bool("reclaim", false, "take back a run this host handed off with the very bundle it exported (you vouch that no other host resumed from it)")
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 1 {
			return usagef("usage: runrecordd import [--id ID] [--reclaim] BUNDLE (- reads standard input)")
		}
		r, err := openInput(pos[0])
		if err != nil {
			return err
		}
		defer r.Close()
		im, err := c.ImportWith(cx, r, *id, *reclaim)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, im, func(w io.Writer) {
			fmt.Fprintf(w, "imported %s: %d objects, %s, verified from genesis\n", printable(im.Run.ID), im.Objects, bytesString(im.Bytes))
			printGrants(w, im.Grants)
			printSigners(w, im.Signers, true)
			runTable(w, []api.Run{im.Run})
		})
	})
}

func cmdHost(args []string, stdout io.Writer) error {
	v := newVerb("host")
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 0 {
			return usagef("usage: runrecordd host")
		}
		h, err := c.Host(cx)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, h, func(w io.Writer) {
			fmt.Fprintf(w, "host key:\t%s\nstate:\t%s\ncontainerd:\t%s (embedded %v)\nRAPL:\t%v %s\n", h.KeyID, h.StateDir, h.Containerd, h.Embedded, h.RAPL, strings.Join(h.RAPLReason, "; "))
			ip := h.ImageParks
			switch ip.Status {
			case "available":
				fmt.Fprintf(w, "image parks:\tavailable (probe %v)\n", time.Duration(ip.ProbeNS).Round(time.Millisecond))
			case "unavailable":
				fmt.Fprintf(w, "image parks:\tunavailable: %s\n", ip.Reason)
			default:
				fmt.Fprintf(w, "image parks:\t%s\n", ip.Status)
			}
			for _, n := range ip.Notes {
				fmt.Fprintf(w, "\t%s\n", n)
			}
			for k, v := range h.Manifest {
				fmt.Fprintf(w, "%s:\t%s\n", k, v)
			}
		})
	})
}

// exitCode is the exit status for a failed verb (see the usage text).
func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) || errors.Is(err, flag.ErrHelp) {
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
		api.CodeRecordInvalid, api.CodeObjectCorrupt, api.CodeMissingObject, api.CodeCallRefused,
		api.CodeUntrustedSigner, api.CodeGrantRefused, api.CodeBundleLimit:
		return 5
	}
	return 1
}
