// Package docs_test checks the documents themselves: every relative link in
// docs/ (notes included) and README.md names a file that exists, and a link
// to a heading names a heading of that file.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// link is a Markdown inline link's target: [text](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

var heading = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)

func TestRelativeLinks(t *testing.T) {
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	notes, err := filepath.Glob("notes/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, notes...)
	files = append(files, "../README.md")
	if len(files) < 3 {
		t.Fatalf("found only %v", files)
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(stripCode(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %s: %v", f, target, err)
					continue
				}
			}
			checked++
			if frag == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			d, err := os.ReadFile(dest)
			if err != nil {
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if !hasAnchor(string(d), frag) {
				t.Errorf("%s: link %s: no heading %q in %s", f, target, frag, dest)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link checked")
	}
}

// stripCode drops fenced code blocks, whose brackets are not links.
func stripCode(s string) string {
	var out strings.Builder
	in := false
	for _, line := range strings.SplitAfter(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			continue
		}
		if !in {
			out.WriteString(line)
		}
	}
	return out.String()
}

// hasAnchor reports whether doc has a heading whose GitHub anchor is frag
// (lower case, spaces to hyphens, punctuation other than - and _ dropped),
// or an HTML anchor <a id="frag">.
func hasAnchor(doc, frag string) bool {
	if strings.Contains(doc, `<a id="`+frag+`">`) {
		return true
	}
	for _, m := range heading.FindAllStringSubmatch(stripCode(doc), -1) {
		if anchor(m[1]) == frag {
			return true
		}
	}
	return false
}

func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// citation is a comment's or a message's pointer into the docs:
// docs/X.md, "Heading" (or X.md, "Heading" inside docs/).
var citation = regexp.MustCompile(`([a-z-]+\.md),?\s+(?:(?://|#)\s*)?"([^"\n]+)"`)

// Code that cites a heading of a document names one that exists, so a
// reader sent there finds it: the heading, or its start ("Packs" for
// "Packs (format 2)").
func TestCodeCitesHeadings(t *testing.T) {
	var sources []string
	err := filepath.WalkDir("..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "notes") {
			return filepath.SkipDir
		}
		switch filepath.Ext(p) {
		case ".go", ".sh", ".md", ".py", ".ts", ".service", ".toml":
			sources = append(sources, p)
		}
		if d.Name() == "Makefile" {
			sources = append(sources, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]map[string]bool{}
	cited := 0
	for _, src := range sources {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range citation.FindAllStringSubmatch(string(b), -1) {
			doc := m[1]
			hs, ok := headings[doc]
			if !ok {
				d, err := os.ReadFile(doc)
				if err != nil {
					continue // not one of docs/: a README, a man page
				}
				hs = map[string]bool{}
				for _, h := range heading.FindAllStringSubmatch(stripCode(string(d)), -1) {
					hs[strings.ToLower(h[1])] = true
				}
				headings[doc] = hs
			}
			cited++
			if !hasPrefix(hs, strings.ToLower(m[2])) {
				t.Errorf("%s cites %s, %q: no such heading", src, doc, m[2])
			}
		}
	}
	if cited == 0 {
		t.Fatal("no citation checked")
	}
}

func hasPrefix(headings map[string]bool, cited string) bool {
	for h := range headings {
		if h == cited || strings.HasPrefix(h, cited+" ") || strings.HasPrefix(h, cited+":") {
			return true
		}
	}
	return false
}
