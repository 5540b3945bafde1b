package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestBashCompletion loads the generated bash completion into bash and
// asks it for candidates, as a user's <TAB> does.
func TestBashCompletion(t *testing.T) {
	var script bytes.Buffer
	if err := cmdCompletion([]string{"bash"}, &script); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "runrecordd.bash")
	if err := os.WriteFile(path, script.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) []string {
		t.Helper()
		// COMP_WORDS is the line so far; the last word is the one
		// being completed.
		q := make([]string, len(words))
		for i, w := range words {
			q[i] = "'" + w + "'"
		}
		sh := "source " + path + "; COMP_WORDS=(" + strings.Join(q, " ") + "); COMP_CWORD=" +
			strconv.Itoa(len(words)-1) + "; _runrecordd; printf '%s\\n' \"${COMPREPLY[@]}\""
		cmd := exec.Command("bash", "--norc", "--noprofile", "-c", sh)
		cmd.Dir = t.TempDir()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				got = append(got, l)
			}
		}
		return got
	}
	for _, c := range []struct {
		words []string
		want  []string
	}{
		{[]string{"runrecordd", "re"}, []string{"resume"}},
		{[]string{"runrecordd", "wa"}, []string{"wait-proof", "watch"}},
		{[]string{"runrecordd", "run", "--me"}, []string{"--memory"}},
		{[]string{"runrecordd", "run", "--cpu"}, []string{"--cpu", "--cpus"}},
		{[]string{"runrecordd", "fleet", "ad"}, []string{"admit"}},
		{[]string{"runrecordd", "fleet", "admit", "--ro"}, []string{"--role"}},
		{[]string{"runrecordd", "fleet", "status", "-"}, nil},
		{[]string{"runrecordd", "completion", ""}, []string{"bash", "fish", "zsh"}},
		{[]string{"runrecordd", "logs", "-"}, nil},
	} {
		got := complete(c.words...)
		slices.Sort(got)
		want := c.want
		switch {
		case want == nil && len(got) == 0:
			t.Errorf("%q: no candidates", c.words)
		case want != nil && !slices.Equal(got, want):
			t.Errorf("%q: candidates %q, want %q", c.words, got, want)
		}
	}
	// Every flag a verb takes is a candidate for "-".
	fs, err := verbFlags(command{name: "logs", run: cmdLogs}, "")
	if err != nil {
		t.Fatal(err)
	}
	got := complete("runrecordd", "logs", "-")
	for _, f := range flagList(fs) {
		if !slices.Contains(got, flagSpelling(f.Name)) {
			t.Errorf("logs -<TAB>: %s missing from %q", flagSpelling(f.Name), got)
		}
	}
	// A word that is no flag completes file names.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "run.bundle"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got = complete("runrecordd", "import", filepath.Join(dir, "run.b"))
	if !slices.Equal(got, []string{filepath.Join(dir, "run.bundle")}) {
		t.Errorf("import FILE<TAB>: %q", got)
	}
}

// noJSON are the verbs that print no result a script would parse: the
// daemon (its log has --log-format), and generated scripts and pages.
var noJSON = []string{"serve", "completion", "man"}

// Every other verb, and each sub-verb, takes -o (table or json).
func TestEveryVerbTakesOutput(t *testing.T) {
	table, err := verbTable()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range table {
		for _, s := range v.subs {
			has := slices.ContainsFunc(s.flags, func(f *flag.Flag) bool { return f.Name == "o" })
			if has == slices.Contains(noJSON, v.name) {
				t.Errorf("%s %s: -o %v", v.name, s.name, has)
			}
		}
	}
}
