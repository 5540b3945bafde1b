package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

func cmdImages(args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "import" {
		return usagef("usage: runrecordd images import FILE [--name NAME]")
	}
	v := newVerb("images import")
	name := v.fs.String("name", "", "name to give the image (default: the archive's own)")
	v.withProgress(stdout)
	return v.run(args[1:], func(pos []string, c *api.Client, cx context.Context) error {
		if len(pos) != 1 {
			return usagef("usage: runrecordd images import FILE [--name NAME] (FILE - reads standard input)")
		}
		r, err := openInput(pos[0])
		if err != nil {
			return err
		}
		defer r.Close()
		p := v.startProgress(progressEvent{Verb: "images import", File: pos[0]}, sizeOf(r), true)
		img, err := c.ImportImage(cx, p.Reader(r), *name)
		p.Done(err)
		if err != nil {
			return err
		}
		return v.cf.print(stdout, img, func(w io.Writer) {
			fmt.Fprintf(w, "NAME\tDIGEST\n%s\t%s\n", img.Name, img.Digest)
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
			printCRIU(w, h.CRIU)
			fmt.Fprintf(w, "user namespaces:\t%s\n", userNamespaces(h))
			for _, x := range h.PostCopyHolds {
				fmt.Fprintf(w, "post-copy hold:\t%s for host %s at %s, since %s, ends by %s\n", x.Run, x.Target, x.Head, x.Since.Format(time.RFC3339), x.Ends.Format(time.RFC3339))
			}
			for _, x := range h.PostCopyOwings {
				fmt.Fprintf(w, "post-copy owing:\t%s from host %s at %s, %d slabs, %s", x.Run, x.Source, x.Head, x.Slabs, x.State)
				switch {
				case x.Tried != nil && x.State == "stranded":
					fmt.Fprintf(w, " since %s", x.Tried.Format(time.RFC3339))
				case x.Tried != nil:
					fmt.Fprintf(w, " since a try at %s", x.Tried.Format(time.RFC3339))
				}
				if x.Reason != "" {
					fmt.Fprintf(w, ": %s", x.Reason)
				}
				fmt.Fprintln(w)
			}
			for _, k := range slices.Sorted(maps.Keys(h.Manifest)) {
				fmt.Fprintf(w, "%s:\t%s\n", k, h.Manifest[k])
			}
		})
	})
}

// printCRIU prints the CRIU build: its version and source, each patch,
// what it can do that upstream CRIU cannot, and each fast path off for
// want of a patch.
func printCRIU(w io.Writer, b api.CRIUBuild) {
	if b.Known {
		fmt.Fprintf(w, "CRIU build:\t%s %s (deploy/setup.sh's build)\n", b.Binary, b.Version)
		if b.Source != nil {
			fmt.Fprintf(w, "\tsource %s sha256:%s\n", b.Source.Name, b.Source.SHA256)
		}
	} else {
		fmt.Fprintf(w, "CRIU build:\t%s %s, not known: %s\n", b.Binary, b.Version, b.Unknown)
	}
	for _, p := range b.Patches {
		if p.SHA256 != "" {
			fmt.Fprintf(w, "\tpatch %s sha256:%s\n", p.Name, p.SHA256)
		} else {
			fmt.Fprintf(w, "\tpatch %s (its mark found in the binary)\n", p.Name)
		}
	}
	if len(b.Patches) == 0 {
		fmt.Fprintf(w, "\tno deploy/criu patch\n")
	}
	if len(b.Capabilities) > 0 {
		fmt.Fprintf(w, "\tcan: %s\n", strings.Join(b.Capabilities, ", "))
	} else {
		fmt.Fprintf(w, "\tcan: what upstream CRIU can\n")
	}
	for _, o := range b.Off {
		fmt.Fprintf(w, "\toff: %s\n", o)
	}
}

// userNamespaces says in words whether h's units run in user namespaces,
// and why image units do or do not.
func userNamespaces(h api.Host) string {
	if !h.UserNamespaces {
		return "off: every unit runs as the host's root (serve --user-namespaces=false --allow-host-root-images)"
	}
	const on = "on: each run's ids map to a host range of its own; "
	switch {
	case h.ImageParks.UserNamespaces:
		return on + "image units too (a dump and restore in a user namespace passed)"
	case h.ImageParks.Status == "probing":
		return on + "image units wait for the probe's dump and restore in one"
	case h.ImageParks.Status == "available" && h.HostRootImages:
		return on + "image units run as the host's root (--allow-host-root-images): a dump and restore in a user namespace failed (see image parks)"
	case h.HostRootImages:
		return on + "image units would run as the host's root (--allow-host-root-images); image parks are unavailable"
	default:
		return on + "image units are refused: no dump and restore in a user namespace passed, and --allow-host-root-images is off"
	}
}
