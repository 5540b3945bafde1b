package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// cmdTrust is `trust add KEY [--name NAME]`, `trust list` and `trust
// remove KEY`: the host keys whose attestations this daemon accepts in a
// bundle (docs/trust.md).
func cmdTrust(args []string, stdout io.Writer) error {
	const use = "usage: runrecordd trust add KEY [--name NAME] | trust list | trust remove KEY"
	if len(args) == 0 {
		return usagef(use)
	}
	sub, args := args[0], args[1:]
	v := newVerb("trust " + sub)
	name := ""
	if sub == "add" {
		v.fs.StringVar(&name, "name", "", "a name for the key (the host it belongs to)")
	}
	return v.run(args, func(pos []string, c *api.Client, cx context.Context) error {
		switch {
		case sub == "list" && len(pos) == 0:
			keys, err := c.TrustedKeys(cx)
			if err != nil {
				return err
			}
			return v.cf.print(stdout, keys, func(w io.Writer) {
				for _, k := range keys {
					fmt.Fprintf(w, "%s\t%s\n", k.Key, printable(k.Name))
				}
			})
		case sub == "add" && len(pos) == 1:
			k, err := c.Trust(cx, pos[0], name)
			if err != nil {
				return err
			}
			return v.cf.print(stdout, k, func(w io.Writer) { fmt.Fprintf(w, "trusted %s %s\n", k.Key, printable(k.Name)) })
		case sub == "remove" && len(pos) == 1:
			if err := c.Untrust(cx, pos[0]); err != nil {
				return err
			}
			return v.cf.print(stdout, struct{}{}, func(w io.Writer) { fmt.Fprintf(w, "no longer trusted: %s\n", pos[0]) })
		}
		return usagef(use)
	})
}

// printSigners writes who signed a record's attestations.
func printSigners(w io.Writer, signers []api.Signer, judged bool) {
	for _, s := range signers {
		trust := "untrusted"
		switch {
		case !judged:
			trust = "trust not judged (no daemon)"
		case s.Trusted:
			trust = "trusted"
		}
		name := ""
		if s.Name != "" {
			name = " (" + printable(s.Name) + ")"
		}
		fmt.Fprintf(w, "interval %d (segment %d): signed by %s%s: %s\n", s.Interval, s.Segment, s.Key, name, trust)
	}
}

// printGrants writes the grant set a run resumes under.
func printGrants(w io.Writer, g unit.Grants) {
	var mounts []string
	for _, m := range g.ReadOnly {
		mounts = append(mounts, printable(m.Source)+":"+printable(m.Target))
	}
	if len(mounts) == 0 {
		mounts = []string{"none"}
	}
	fmt.Fprintf(w, "grants: cpu %d milli, memory %s, network %s, read-only mounts: %s\n",
		g.MilliCPU, bytesString(int64(g.MemoryBytes)), g.Network, strings.Join(mounts, ", "))
}
