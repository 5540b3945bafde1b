package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestReadmeLayout holds README.md's layout table to the module: every
// package `go list ./...` names is in a row (by its path, or under a row's
// path that ends in /; the module's root package by one of its files),
// every path in a row exists, and every doc in docs/ is linked.
func TestReadmeLayout(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	_, table, ok := strings.Cut(readme, "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no ## Layout section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	var rows []string
	cell := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range cell.FindAllStringSubmatch(first, -1) {
			rows = append(rows, m[1])
		}
	}
	if len(rows) == 0 {
		t.Fatal("no rows in README.md's layout table")
	}
	for _, r := range rows {
		if _, err := os.Stat(filepath.Join(root, r)); err != nil {
			t.Errorf("layout row %s: %v", r, err)
		}
	}
	cmd := exec.Command("go", "list", "-f", "{{.Dir}}|{{join .GoFiles \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, files, _ := strings.Cut(line, "|")
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		covered := slices.ContainsFunc(rows, func(r string) bool {
			if rel == "." {
				return slices.Contains(strings.Fields(files), r)
			}
			return r == rel || strings.HasSuffix(r, "/") && strings.HasPrefix(rel+"/", r)
		})
		if !covered {
			t.Errorf("package %s is in no row of README.md's layout table", rel)
		}
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("docs: %v", err)
	}
	for _, d := range docs {
		if link := "](docs/" + filepath.Base(d) + ")"; !strings.Contains(readme, link) {
			t.Errorf("README.md does not link docs/%s", filepath.Base(d))
		}
	}
}
