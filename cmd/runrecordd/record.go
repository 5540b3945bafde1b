package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/runrecordd/runrecordd"
	"github.com/runrecordd/runrecordd/internal/conformance"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func cmdConformance(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var classes []conformance.Class
	var err error
	switch fs.NArg() {
	case 0:
		classes, err = conformance.LoadFS(runrecordd.Conformance, "testdata/conformance")
	case 1:
		classes, err = conformance.Load(fs.Arg(0))
	default:
		return usagef("at most one directory, got %d arguments", fs.NArg())
	}
	if err != nil {
		return err
	}
	failed := 0
	for _, c := range classes {
		res := conformance.Run(c)
		if res.Passed() {
			fmt.Fprintf(stdout, "%-4s passed (%d cases)\n", res.Class, res.Cases)
			continue
		}
		failed++
		fmt.Fprintf(stdout, "%-4s FAILED (%d of %d cases)\n", res.Class, len(res.Failed), res.Cases)
		for _, f := range res.Failed {
			fmt.Fprintf(stdout, "     %s\n", f)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d classes failed", failed, len(classes))
	}
	return nil
}

func cmdVerify(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	file := fs.String("file", "", "a record's wire form (- for standard input)")
	var cf clientFlags
	cf.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *file == "" && len(pos) == 1 {
		return verifyRun(cf, pos[0], stdout)
	}
	if *file == "" || len(pos) != 0 {
		return usagef("give the run (verify RUN) or the record with --file FILE")
	}
	var b []byte
	if *file == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(*file)
	}
	if err != nil {
		return err
	}
	r, err := record.DecodeWire(b)
	if err != nil {
		return fmt.Errorf("%s does not verify: %w", *file, err)
	}
	fmt.Fprintf(stdout, "verified from genesis: %d segments, %s, head %s\n", r.Len(), r.Phase(), r.Head())
	fmt.Fprintf(stdout, "wait proof: %s\n", r.WaitProof())
	return nil
}
