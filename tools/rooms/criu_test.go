package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The CRIU rule refuses a package outside internal/criu that imports
// go-criu or speaks CRIU in its source, and lets internal/criu and the
// packages under it do both.
func TestCRIURuleCatchesBreaks(t *testing.T) {
	var rule Rule
	for _, r := range Rules {
		if strings.HasPrefix(r.Name, "only "+CRIURoom+" speaks CRIU") {
			rule = r
		}
	}
	if rule.Check == nil {
		t.Fatal("no CRIU rule")
	}
	g := graph(
		"internal/executor internal/criu internal/criu/pageserver",
		"internal/criu "+GoCRIU+"v7/crit/images/pstree "+GoCRIU+"v7/stats",
		"internal/criu/pageserver pkg/record",
		"internal/criuish",
	)
	g["internal/criu/pageserver"].CRIU = []string{`lazypages.go:10 "lazy-pages"`}
	g["internal/criu"].CRIU = []string{`conf.go:3 "org.criu.config"`}
	if b := rule.Check(g); len(b) > 0 {
		t.Errorf("internal/criu speaking CRIU refused: %v", b)
	}
	g["internal/executor"].Imports = append(g["internal/executor"].Imports, GoCRIU+"v7/stats")
	g["internal/executor"].CRIU = []string{`spec.go:206 "org.criu.config"`}
	g["internal/criuish"].CRIU = []string{"probe.go:77 exec.LookPath(c.cfg.CRIU)"}
	want := []string{
		"internal/criuish/probe.go:77 exec.LookPath(c.cfg.CRIU)",
		"internal/executor imports " + GoCRIU + "v7/stats",
		`internal/executor/spec.go:206 "org.criu.config"`,
	}
	if b := rule.Check(g); !slices.Equal(b, want) {
		t.Errorf("breaches %q, want %q", b, want)
	}
}

// speaksCRIU finds CRIU's configuration named in a literal, a word of a
// CRIU command line, and os/exec running something named criu; not a
// comment, an import, or a literal that only holds the word criu.
func TestSpeaksCRIU(t *testing.T) {
	src := `package p

import (
	"os/exec"
	criuimages "github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
)

// criu.conf, org.criu.config and lazy-pages in a comment are no breach.
var _ = criuimages.PstreeEntry{}

type cfg struct{ CRIU string }

func f(c cfg, bin string) {
	_ = exec.Command(c.CRIU, "check")
	_, _ = exec.LookPath("criu")
	_ = exec.Command(bin, "lazy-pages")
	_ = exec.Command("runc", "--version")
	_ = map[string]string{"org.criu.config": "/state/criu.conf"}
	_ = "criu"
	_ = "staging/criu"
}
`
	path := filepath.Join(t.TempDir(), "p.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := speaksCRIU(path, "p.go")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"p.go:14 exec.Command(c.CRIU)",
		"p.go:15 exec.LookPath(\"criu\")",
		`p.go:16 "lazy-pages"`,
		`p.go:18 "org.criu.config"`,
		`p.go:18 "/state/criu.conf"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("speaksCRIU = %q, want %q", got, want)
	}
}
