package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/runrecordd/runrecordd/internal/version"
	"github.com/runrecordd/runrecordd/pkg/api"
)

// cmdMan is `man`: the manual page, runrecordd(1) in roff, from the same
// verb table as help and completion. `runrecordd man | man -l -` reads it.
func cmdMan(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("man", flag.ContinueOnError)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("usage: runrecordd man")
	}
	table, err := verbTable()
	if err != nil {
		return err
	}
	manPage(stdout, table, version.Get().Version)
	return nil
}

// manPage writes runrecordd(1): every verb with its synopsis and flags,
// the exit codes and the environment.
func manPage(w io.Writer, table []verbEntry, ver string) {
	fmt.Fprintf(w, ".TH RUNRECORDD 1 \"\" %s \"runrecordd manual\"\n", roff("runrecordd "+ver))
	fmt.Fprint(w, `.SH NAME
runrecordd \- run agent units in sandboxes, park and resume them, and keep a verifiable run record
.SH SYNOPSIS
.B runrecordd
.I COMMAND
.RI [ ARGS ]
.br
.B runrecordd help
.I COMMAND
.SH DESCRIPTION
.B runrecordd serve
is the daemon: it runs units in containerd sandboxes, parks them (a CRIU image, or a transcript),
resumes them here or on another host after checking the snapshot, the host's manifest and the record,
and appends every transition to a hash-chained run record.
The other commands are its clients: they talk to the daemon on its unix socket
and print tables, or JSON with
.BR "\-o json" .
Flags may come before or after a command's arguments, spelled
.B \-name
or
.BR \-\-name .
.SH COMMANDS
`)
	for _, v := range table {
		fmt.Fprintf(w, ".SS %s\n%s\n", roff(v.name), roff(v.summary))
		for _, s := range v.subs {
			if s.name != "" {
				fmt.Fprintf(w, ".PP\n.B %s\n", roff(v.name+" "+s.name))
			}
			for _, f := range s.flags {
				arg, use := flag.UnquoteUsage(f)
				spell := flagSpelling(f.Name)
				if arg != "" {
					spell += " " + arg
				}
				fmt.Fprintf(w, ".TP\n.B %s\n%s", roff(spell), roff(use))
				if !zeroDefault(f.DefValue) {
					fmt.Fprintf(w, " (default %s)", roff(f.DefValue))
				}
				fmt.Fprintln(w)
			}
		}
	}
	fmt.Fprintf(w, `.SH EXIT STATUS
.TP
0
success
.TP
1
the operation ran and failed
.TP
2
bad usage
.TP
3
no daemon answers on the socket
.TP
4
no such run, image or call
.TP
5
refused by a rule: a phase, a resume precondition, a damaged record or object, a conflicting operation
.SH ENVIRONMENT
.TP
.B RUNRECORDD_SOCKET
the daemon's socket for client commands (default %s)
.SH FILES
.TP
.B /etc/runrecordd/config.toml
the daemon's settings, keys named as
.BR serve 's
flags
.TP
.B /var/lib/runrecordd
the daemon's state directory
.SH SEE ALSO
.BR "runrecordd help COMMAND" ,
.B runrecordd completion
`, roff(api.DefaultSocket))
}

// roff escapes text for a roff line: backslashes, and a leading dot or
// quote that would make it a request.
func roff(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	s = strings.ReplaceAll(s, "\n", " ")
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

// zeroDefault says whether a flag's default is its type's zero value,
// which the page does not state.
func zeroDefault(v string) bool {
	switch v {
	case "", "false", "0", "0s":
		return true
	}
	return false
}
