package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// parseBytes reads a size: 1048576; 512Ki, 512Mi, 1Gi (powers of 1024);
// 512K, 512M, 1G (powers of 1000); and Podman's spellings 512b, 512k,
// 512m, 1g (powers of 1024).
func parseBytes(size string) (uint64, error) {
	s, mult := size, uint64(1)
	for _, u := range []struct {
		suffix string
		m      uint64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9},
		{"b", 1}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.m
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > math.MaxUint64/mult {
		return 0, fmt.Errorf("%q is not a size (e.g. 512Mi or 512m, 1G, 1048576)", size)
	}
	return n * mult, nil
}

// parseCPUs reads Podman's --cpus: a number of cores, to the thousandth
// (1.5), as thousandths of a core.
func parseCPUs(s string) (uint32, error) {
	v, err := strconv.ParseFloat(s, 64)
	m := math.Round(v * 1000)
	if err != nil || v <= 0 || m < 1 || m > math.MaxUint32 || math.Abs(v*1000-m) > 1e-6 {
		return 0, fmt.Errorf("%q is not a number of cores over 0, to the thousandth (e.g. 1.5)", s)
	}
	return uint32(m), nil
}

// runFlags are run's flags: the unit, its grant set and its limits.
type runFlags struct {
	cf                                                                    clientFlags
	id, mode, network                                                     string
	cpu                                                                   uint
	cpus, mem                                                             string
	env, ro, secrets                                                      listFlag
	pids, conns, calls                                                    uint
	logBytes, transcriptBytes, inflightBytes, payloadBytes, snapshotBytes string
}

func (f *runFlags) register(fs *flag.FlagSet) {
	f.cf.register(fs)
	d := unit.DefaultLimits
	fs.StringVar(&f.id, "id", "", "the run's id (default: made up)")
	fs.StringVar(&f.mode, "mode", "image", "how the unit parks: image or transcript")
	fs.UintVar(&f.cpu, "cpu", 0, "CPU limit in thousandths of a core (0: unlimited)")
	fs.StringVar(&f.cpus, "cpus", "", "CPU limit in cores, as Podman spells it (1.5 is --cpu 1500)")
	fs.StringVar(&f.mem, "memory", "0", "memory limit, e.g. 512Mi or 512m; 0 is the daemon's default, 1 GiB (there is no unlimited; docs/limits.md)")
	fs.StringVar(&f.network, "network", "none", "network: none or loopback")
	fs.Var(&f.env, "env", "KEY=VALUE for the unit (repeatable)")
	fs.Var(&f.ro, "ro", "SRC:DST read-only bind mount (repeatable)")
	fs.Var(&f.secrets, "secret", secretUsage)
	fs.UintVar(&f.pids, "pids", 0, fmt.Sprintf("processes and threads in the sandbox (0: the default, %d)", d.Pids))
	fs.StringVar(&f.logBytes, "log-bytes", "0", fmt.Sprintf("bytes of stdout, and of stderr, kept per interval (0: the default, %s)", bytesString(int64(d.LogBytes))))
	fs.StringVar(&f.transcriptBytes, "transcript-bytes", "0", fmt.Sprintf("a transcript unit's transcript size (0: the default, %s)", bytesString(int64(d.TranscriptBytes))))
	fs.UintVar(&f.conns, "channel-conns", 0, fmt.Sprintf("connections open at once on a transcript unit's channel (0: the default, %d)", d.ChannelConns))
	fs.StringVar(&f.inflightBytes, "channel-inflight-bytes", "0", fmt.Sprintf("unanswered request bytes held on the channel (0: the default, %s)", bytesString(int64(d.ChannelInflightBytes))))
	fs.UintVar(&f.calls, "interval-calls", 0, fmt.Sprintf("calls a unit may dispatch in one interval (0: the default, %d)", d.IntervalCalls))
	fs.StringVar(&f.payloadBytes, "interval-payload-bytes", "0", fmt.Sprintf("append and dispatch payload bytes in one interval (0: the default, %s)", bytesString(int64(d.IntervalPayloadBytes))))
	fs.StringVar(&f.snapshotBytes, "snapshot-bytes", "0", fmt.Sprintf("the run's snapshot quota, all its parks together (0: the default, %s)", bytesString(int64(d.SnapshotBytes))))
}

// request is the run request the flags and the positional arguments
// (IMAGE [ARGS...]) ask for.
func (f *runFlags) request(pos []string) (api.RunRequest, error) {
	var req api.RunRequest
	if len(pos) == 0 {
		return req, usagef("usage: runrecordd run [flags] IMAGE [ARGS...]")
	}
	m, err := unit.ParseMode(f.mode)
	if err != nil {
		return req, usagef("--mode: %v", err)
	}
	n, err := unit.ParseNetwork(f.network)
	if err != nil {
		return req, usagef("--network: %v", err)
	}
	mb, err := parseBytes(f.mem)
	if err != nil {
		return req, usagef("--memory: %v", err)
	}
	if f.cpu > math.MaxUint32 {
		return req, usagef("--cpu %d: at most %d", f.cpu, uint32(math.MaxUint32))
	}
	cpu := uint32(f.cpu)
	if f.cpus != "" {
		if f.cpu != 0 {
			return req, usagef("give --cpu or --cpus, not both")
		}
		if cpu, err = parseCPUs(f.cpus); err != nil {
			return req, usagef("--cpus: %v", err)
		}
	}
	req = api.RunRequest{ID: f.id,
		Unit:   unit.Spec{Image: pos[0], Args: pos[1:], Env: f.env, Mode: m},
		Grants: unit.Grants{MilliCPU: cpu, MemoryBytes: mb, Network: n}}
	if req.Secrets, err = parseSecrets(f.secrets); err != nil {
		return req, err
	}
	for _, r := range f.ro {
		src, dst, ok := strings.Cut(r, ":")
		if !ok {
			return req, usagef("--ro %s: use SRC:DST", r)
		}
		req.Grants.ReadOnly = append(req.Grants.ReadOnly, unit.Mount{Source: src, Target: dst})
	}
	l := &req.Grants.Limits
	for _, c := range []struct {
		name string
		v    uint
		to   *uint32
	}{{"pids", f.pids, &l.Pids}, {"channel-conns", f.conns, &l.ChannelConns}, {"interval-calls", f.calls, &l.IntervalCalls}} {
		if c.v > math.MaxUint32 {
			return req, usagef("--%s %d: at most %d", c.name, c.v, uint32(math.MaxUint32))
		}
		*c.to = uint32(c.v)
	}
	for _, c := range []struct {
		name, v string
		to      *uint64
	}{{"log-bytes", f.logBytes, &l.LogBytes}, {"transcript-bytes", f.transcriptBytes, &l.TranscriptBytes},
		{"channel-inflight-bytes", f.inflightBytes, &l.ChannelInflightBytes},
		{"interval-payload-bytes", f.payloadBytes, &l.IntervalPayloadBytes}, {"snapshot-bytes", f.snapshotBytes, &l.SnapshotBytes}} {
		if *c.to, err = parseBytes(c.v); err != nil {
			return req, usagef("--%s: %v", c.name, err)
		}
	}
	return req, nil
}

// secretUsage is --secret's help, run's and resume's.
const secretUsage = "NAME=VALUE: a secret the unit reads as /run/secrets/NAME, never recorded; NAME alone takes the value from this environment's $NAME, off the command line (repeatable)"

// parseSecrets reads --secret flags: NAME=VALUE, or NAME with the value
// from the environment variable NAME.
func parseSecrets(flags []string) (map[string]string, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, s := range flags {
		name, value, ok := strings.Cut(s, "=")
		if !ok {
			if value, ok = os.LookupEnv(name); !ok {
				return nil, usagef("--secret %s: no =VALUE, and no environment variable %s", name, name)
			}
		}
		if err := unit.CheckSecretName(name); err != nil {
			return nil, usagef("--secret: %v", err)
		}
		if _, dup := out[name]; dup {
			return nil, usagef("--secret %s: given twice", name)
		}
		out[name] = value
	}
	return out, nil
}

func cmdRun(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var f runFlags
	f.register(fs)
	// Flags end at IMAGE: what follows it is the unit's argv.
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	req, err := f.request(fs.Args())
	if err != nil {
		return err
	}
	c, err := f.cf.client()
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	run, err := c.Start(cx, req)
	if err != nil {
		return err
	}
	return f.cf.print(stdout, run, func(w io.Writer) { runTable(w, []api.Run{run}) })
}

func runTable(w io.Writer, runs []api.Run) { runTableAt(w, runs, time.Now()) }

// runTableAt prints runs as of now: AGE since each run started, PARKED
// since its last park (empty while it is not parked, or unknown).
func runTableAt(w io.Writer, runs []api.Run, now time.Time) {
	fmt.Fprintln(w, "RUN\tSTATUS\tAGE\tPARKED\tSEGMENTS\tIMAGE\tHEAD")
	for _, r := range runs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", printable(r.ID), r.Status, since(r.Started, now), since(r.ParkedAt, now),
			r.Segments, printable(r.Image), r.Head)
	}
}

// since is the time from t to now in its two largest units (42s, 3m07s,
// 5h02m, 12d04h); empty when t is unknown, 0s when t is after now (another
// host's clock).
func since(t time.Time, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := max(now.Sub(t), 0)
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd%02dh", s/86400, s%86400/3600)
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
