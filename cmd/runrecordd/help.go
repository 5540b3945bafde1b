package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// subverbs are the verbs whose flags depend on a sub-verb, with each.
var subverbs = map[string][]string{
	"images": {"import"},
	"trust":  {"add", "list", "remove"},
	"fleet":  {"key", "admit", "status", "revoke"},
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
			args := []string{"-h"}
			title := "flags"
			if sub != "" {
				args = []string{sub, "-h"}
				title = "flags of " + c.name + " " + sub
			}
			text, err := flagHelp(c, args)
			if err != nil {
				fmt.Fprintf(stderr, "runrecordd help: %v\n", err)
				return 1
			}
			if text == "" {
				fmt.Fprintf(w, "\n%s: none\n", title)
				continue
			}
			fmt.Fprintf(w, "\n%s:\n%s", title, text)
		}
		return 0
	}
	fmt.Fprintf(stderr, "runrecordd help: unknown command %q\n", name)
	usage(stderr)
	return 2
}

// flagHelp runs c with args (ending in -h) and returns the flags' help the
// flag package prints, without its "Usage of" line. The flag package
// prints to os.Stderr, which is a file of this function's while c runs.
func flagHelp(c command, args []string) (string, error) {
	f, err := os.CreateTemp("", "runrecordd-help")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	saved := os.Stderr
	os.Stderr = f
	err = c.run(args, io.Discard)
	os.Stderr = saved
	if !errors.Is(err, flag.ErrHelp) {
		return "", fmt.Errorf("%s %s: %v", c.name, strings.Join(args, " "), err)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		return "", err
	}
	text := string(b)
	if strings.HasPrefix(text, "Usage of ") {
		_, text, _ = strings.Cut(text, "\n")
	}
	return text, nil
}
