package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// subverbs are the verbs whose flags depend on a sub-verb, with each.
var subverbs = map[string][]string{
	"images":     {"import"},
	"trust":      {"add", "list", "remove"},
	"fleet":      {"key", "admit", "status", "revoke"},
	"completion": {"bash", "zsh", "fish"},
}

// flagSink, while set, receives the flag set a verb is about to parse
// (parseFlags), and the verb goes no further.
var flagSink func(*flag.FlagSet)

// verbFlags returns the flags verb c declares, for sub-verb sub ("" for
// none), without running it: the same flag set the verb parses, so help,
// completion and the man page cannot drift from it.
func verbFlags(c command, sub string) (*flag.FlagSet, error) {
	var got *flag.FlagSet
	flagSink = func(fs *flag.FlagSet) { got = fs }
	defer func() { flagSink = nil }()
	var args []string
	if sub != "" {
		args = []string{sub}
	}
	err := c.run(args, io.Discard)
	if got == nil {
		return nil, fmt.Errorf("%s %s declares no flags: %v", c.name, sub, err)
	}
	if !errors.Is(err, flag.ErrHelp) {
		return nil, fmt.Errorf("%s %s: %v", c.name, sub, err)
	}
	return got, nil
}

// flagList is a verb's flags in name order.
func flagList(fs *flag.FlagSet) []*flag.Flag {
	var out []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { out = append(out, f) })
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// flagSpelling is how the help and completion write a flag: -f for a
// one-letter flag, --name for the others (the flag package takes both).
func flagSpelling(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// help prints verb name's whole usage to w: what it does and its synopsis,
// then the flags of it (or of each of its sub-verbs) with their help, as
// `runrecordd VERB -h` prints them. It returns the exit code.
func help(name string, w, stderr io.Writer) int {
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		fmt.Fprintf(w, "runrecordd %s: %s\n", c.name, c.summary)
		subs := subverbs[c.name]
		if subs == nil {
			subs = []string{""}
		}
		for _, sub := range subs {
			title := "flags"
			if sub != "" {
				title = "flags of " + c.name + " " + sub
			}
			fs, err := verbFlags(c, sub)
			if err != nil {
				fmt.Fprintf(stderr, "runrecordd help: %v\n", err)
				return 1
			}
			var b bytes.Buffer
			fs.SetOutput(&b)
			fs.PrintDefaults()
			if b.Len() == 0 {
				fmt.Fprintf(w, "\n%s: none\n", title)
				continue
			}
			fmt.Fprintf(w, "\n%s:\n%s", title, b.String())
		}
		return 0
	}
	fmt.Fprintf(stderr, "runrecordd help: unknown command %q\n", name)
	usage(stderr)
	return 2
}

// verbEntry is a verb of the verb table, with its sub-verbs.
type verbEntry struct {
	name, summary string
	subs          []subEntry // one with name "" for a verb without sub-verbs
}

// subEntry is a sub-verb (or the verb itself) and its flags, by name.
type subEntry struct {
	name  string
	flags []*flag.Flag
}

// verbTable is every verb with its sub-verbs and each one's flags: what
// completion and the man page are generated from.
func verbTable() ([]verbEntry, error) {
	var out []verbEntry
	for _, c := range commands() {
		e := verbEntry{name: c.name, summary: c.summary}
		subs := subverbs[c.name]
		if subs == nil {
			subs = []string{""}
		}
		for _, s := range subs {
			fs, err := verbFlags(c, s)
			if err != nil {
				return nil, err
			}
			e.subs = append(e.subs, subEntry{name: s, flags: flagList(fs)})
		}
		out = append(out, e)
	}
	return out, nil
}

// firstLine is a flag's help up to its first newline.
func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
