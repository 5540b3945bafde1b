package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/runrecordd/runrecordd/internal/version"
)

// cmdVersion prints this binary's version, revision and Go version; it
// asks no daemon.
func cmdVersion(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	out := fs.String("o", "table", "output: table or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("version takes no arguments")
	}
	in := version.Get()
	switch *out {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(in)
	case "table":
		fmt.Fprintf(stdout, "runrecordd %s\n", in.Version)
		if in.Revision != "" {
			fmt.Fprintf(stdout, "revision   %s\n", in.Revision)
		}
		fmt.Fprintf(stdout, "go         %s\n", in.Go)
		return nil
	}
	return usagef("-o %s: use table or json", *out)
}
