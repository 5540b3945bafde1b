// Command runrecordd is the durable-run daemon and its client.
//
// Exit codes: 0 success; 1 the operation ran and failed (a record that does
// not verify, a conformance class that fails, a host failure); 2 bad usage;
// 3 no daemon answers on the socket; 4 no such run, image or call; 5 refused
// by a rule (a phase, a resume precondition, a damaged record or object, a
// conflicting operation).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// usageError is bad command-line input: exit code 2.
type usageError struct {
	msg     string
	printed bool // the flag package has said it already
}

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{msg: fmt.Sprintf(format, args...)}
}

type command struct {
	name    string
	summary string
	run     func(args []string, stdout io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the daemon: serve [--config FILE] [--state-dir DIR] [FLAGS] (runrecordd help serve lists every flag)", cmdServe},
		{"images", "import an OCI or docker archive: images import FILE [--name NAME]", cmdImages},
		{"run", "start a run: run [--id ID] [--mode image|transcript] [--cpu M] [--memory SIZE] [--network none|loopback] [--env K=V] IMAGE [ARGS...]", cmdRun},
		{"list", "list runs: list [--phase executing|parked|closed]", cmdList},
		{"show", "a run's segments, evidence, energy and wait proof: show RUN", cmdShow},
		{"park", "park a running run, or every one: park RUN | park --all [--parallel N]", cmdPark},
		{"resume", "resume a parked run on this host: resume [--secret NAME=VALUE ...] RUN", cmdResume},
		{"close", "close a run in any phase: close RUN [--reason TEXT]", cmdClose},
		{"migrate", "move a run to another host of the fleet, parking it first if it runs: migrate RUN --to KEY", cmdMigrate},
		{"adopt", "make a run of a lost host this host's, when it holds it parked at the fleet's head: adopt RUN", cmdAdopt},
		{"drain", "move every run off this host to the fleet's others; new runs are refused: drain [--to KEY ...] [--parallel N]", cmdDrain},
		{"verify", "verify a run (verify RUN), or a bundle or wire form (verify --file FILE)", cmdVerify},
		{"logs", "a run's output across its parks and resumes: logs [-f] [--tail N] [--since T] [--label] RUN", cmdLogs},
		{"wait-proof", "a run's wait-proof verdict: wait-proof RUN", cmdWaitProof},
		{"calls", "outward calls awaiting results, with run and payload: calls", cmdCalls},
		{"post", "post a call's result (resumes the run when it was the last awaited): post RUN CALL JSON", cmdPost},
		{"watch", "stream transitions: watch [--run RUN] [--until KIND]", cmdWatch},
		{"export", "write a run's bundle and hand the run off: export RUN [-f FILE] [--handoff=false]", cmdExport},
		{"import", "import a bundle: import [--id ID] BUNDLE", cmdImport},
		{"trust", "host keys whose bundles this daemon imports: trust add KEY [--name NAME] | trust list | trust remove KEY", cmdTrust},
		{"host", "this daemon's host key, manifest facts and meter", cmdHost},
		{"fleet", "a fleet on etcd: fleet key [--state-dir DIR] | fleet admit KEY --name NAME [--role host|platform] --etcd E | fleet revoke KEY --etcd E | fleet status --etcd E", cmdFleet},
		{"gc", "collect the store: release closed runs' image snapshots past retention, remove what no record reaches: gc [--retention D]", cmdGC},
		{"pin", "keep a run's snapshots whatever the retention time: pin RUN", cmdPin},
		{"unpin", "let a pinned run's snapshots go with the retention time: unpin RUN", cmdUnpin},
		{"conformance", "run the conformance pack: runrecordd conformance [DIR]", cmdConformance},
		{"version", "this binary's version, revision and Go version: version [-o json]", cmdVersion},
		{"completion", "a shell completion script: completion bash|zsh|fish (bash: source <(runrecordd completion bash))", cmdCompletion},
		{"man", "the manual page, runrecordd(1), in roff: man (read it with runrecordd man | man -l -)", cmdMan},
	}
}

func main() {
	pageserver.MaybeRun() // a lazy restore's page server: this binary again
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 2 && args[0] == "help" {
		return help(args[1], stdout, stderr)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(args[1:], stdout)
		if err == nil {
			return 0
		}
		var ue usageError
		switch {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &ue) && ue.printed:
			return 2
		}
		// An error can quote what a unit or a bundle wrote.
		fmt.Fprintf(stderr, "runrecordd %s: %s\n", c.name, printableText(err.Error()))
		var ae *api.Error
		if errors.As(err, &ae) && len(ae.Keys) > 0 {
			fmt.Fprintf(stderr, "differing keys: %s\n", printable(strings.Join(ae.Keys, ", ")))
		}
		return exitCode(err)
	}
	fmt.Fprintf(stderr, "runrecordd: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: runrecordd COMMAND [ARGS]\n       runrecordd help COMMAND   (a command's whole usage)\n\ncommands:")
	defer fmt.Fprintln(w, "\nClient commands talk to the daemon on --socket (or RUNRECORDD_SOCKET; default "+api.DefaultSocket+")\nand print tables, or JSON with -o json.\n\nexit codes: 0 ok; 1 failed; 2 bad usage; 3 no daemon on the socket; 4 not found;\n5 refused by a rule (phase, resume precondition, damaged record or object)")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
}
