// Command runrecordd is the durable-run daemon and its client.
//
// Exit codes: 0 success; 1 the operation ran and failed (a record that does
// not verify, a conformance class that fails); 2 bad usage.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// usageError is bad command-line input: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

type command struct {
	name    string
	summary string
	run     func(args []string, stdout io.Writer) error
}

func commands() []command {
	return []command{
		{"conformance", "run the conformance pack: runrecordd conformance [DIR]", cmdConformance},
		{"verify", "verify a record's wire form from genesis: runrecordd verify --file FILE", cmdVerify},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
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
		fmt.Fprintf(stderr, "runrecordd %s: %v\n", c.name, err)
		var ue usageError
		if errors.As(err, &ue) || errors.Is(err, flag.ErrHelp) {
			return 2
		}
		return 1
	}
	fmt.Fprintf(stderr, "runrecordd: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: runrecordd COMMAND [ARGS]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
}
