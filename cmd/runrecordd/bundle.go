package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/pkg/api"
)

func cmdExport(args []string, stdout io.Writer) error {
	v := newVerb("export")
	file := v.fs.String("f", "-", "write the bundle to this file (- for standard output, which must not be a terminal)")
	handoff := v.fs.Bool("handoff", true, "hand the run off: this host will not resume or close it until a bundle extending it is imported back (false: export a copy, which no host resumes)")
	v.withProgress(stdout)
	return v.runOne(args, func(id string, c *api.Client, cx context.Context) error {
		if *file == "-" && isTerminal(stdout) {
			return errTerminal
		}
		export := c.Export
		if !*handoff {
			export = c.ExportCopy
		}
		if *file == "-" && v.cf.output != "table" {
			return usagef("-o %s needs -f FILE: standard output is the bundle", v.cf.output)
		}
		p := v.startProgress(progressEvent{Verb: "export", Run: id}, 0, true)
		if *file == "-" {
			err := export(cx, id, p.Writer(stdout))
			p.Done(err)
			return err
		}
		// Whole and durable, so a failed export leaves no half bundle
		// under the name, and a finished one survives a crash.
		err := atomicfile.Write(*file, 0o600, func(f *os.File) error { return export(cx, id, p.Writer(f)) })
		p.Done(err)
		if err != nil {
			return err
		}
		st, err := os.Stat(*file)
		if err != nil {
			return err
		}
		out := exported{Run: id, File: *file, Bytes: st.Size(), HandedOff: *handoff}
		// The table form prints nothing: the bundle is the result.
		return v.cf.print(stdout, out, func(io.Writer) {})
	})
}

// exported is export's result with -o json: the bundle written.
type exported struct {
	Run       string `json:"run"`
	File      string `json:"file"`
	Bytes     int64  `json:"bytes"`
	HandedOff bool   `json:"handed_off"`
}

func cmdImport(args []string, stdout io.Writer) error {
	v := newVerb("import")
	id := v.fs.String("id", "", "store the run under this id (default: the bundle's)")
	reclaim := v.fs.Bool("reclaim", false, "take back a run this host handed off with the very bundle it exported (you vouch that no other host resumed from it)")
	v.withProgress(stdout)
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 1 {
			return usagef("usage: runrecordd import [--id ID] [--reclaim] BUNDLE (- reads standard input)")
		}
		r, err := openInput(pos[0])
		if err != nil {
			return err
		}
		defer r.Close()
		p := v.startProgress(progressEvent{Verb: "import", File: pos[0]}, sizeOf(r), true)
		im, err := c.ImportWith(cx, p.Reader(r), *id, *reclaim)
		p.Done(err)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, im, func(w io.Writer) {
			fmt.Fprintf(w, "imported %s: %d objects, %s, verified from genesis\n", printable(im.Run.ID), im.Objects, bytesString(im.Bytes))
			printGrants(w, im.Grants)
			printSigners(w, im.Signers, true)
			if im.Unclaimed != nil {
				fmt.Fprintf(w, "another host of the fleet owns it: stored here, not resumable: %s (%s)\n", printable(im.Unclaimed.Message), im.Unclaimed.Code)
			}
			runTable(w, []api.Run{im.Run})
		})
	})
}
