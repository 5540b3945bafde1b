package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"slices"
	"strconv"
	"strings"
)

// CRIURoom is the one room that speaks CRIU: its images, options,
// configuration, binary, lazy-pages and page server.
const CRIURoom = "internal/criu"

// GoCRIU is the prefix of go-criu's packages, which read and write CRIU's
// images and statistics.
const GoCRIU = "github.com/checkpoint-restore/go-criu/"

// criuConfNames are strings that name CRIU's configuration: its file and
// the OCI annotation that hands the file to CRIU.
var criuConfNames = []string{"criu.conf", "org.criu.config"}

// criuWords are string literals that only a CRIU command line holds.
var criuWords = []string{"lazy-pages", "--images-dir", "uffd-noncoop"}

// speaksCRIU returns where a Go file speaks CRIU, each as "file what": a
// string literal naming CRIU's configuration or one of criuWords, or a
// call of os/exec's Command, CommandContext or LookPath with an argument
// whose source names criu (in any case).
func speaksCRIU(path, name string) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.ImportSpec:
			return false // imports are the graph's
		case *ast.BasicLit:
			s, err := strconv.Unquote(x.Value)
			if x.Kind != token.STRING || err != nil {
				return true
			}
			named := slices.ContainsFunc(criuConfNames, func(c string) bool { return strings.Contains(s, c) })
			if named || slices.Contains(criuWords, s) {
				out = append(out, fmt.Sprintf("%s:%d %q", name, fset.Position(x.Pos()).Line, s))
			}
		case *ast.CallExpr:
			sel, ok := x.Fun.(*ast.SelectorExpr)
			if !ok || types.ExprString(sel.X) != "exec" || !slices.Contains([]string{"Command", "CommandContext", "LookPath"}, sel.Sel.Name) {
				return true
			}
			for _, a := range x.Args {
				if strings.Contains(strings.ToLower(types.ExprString(a)), "criu") {
					out = append(out, fmt.Sprintf("%s:%d exec.%s(%s)", name, fset.Position(x.Pos()).Line, sel.Sel.Name, types.ExprString(a)))
					break
				}
			}
		}
		return true
	})
	return out, nil
}

func init() {
	Rules = append(Rules, Rule{"only " + CRIURoom + " speaks CRIU: imports " + GoCRIU + ", runs criu, names its configuration", func(g Graph) []string {
		var out []string
		for _, p := range g.sorted() {
			if under(p.Path, CRIURoom) || under(p.Path, "tools") { // tools/rooms names CRIU to find it
				continue
			}
			for _, imp := range p.Imports {
				if strings.HasPrefix(imp, GoCRIU) {
					out = append(out, p.Path+" imports "+imp)
				}
			}
			for _, s := range p.CRIU {
				out = append(out, p.Path+"/"+s)
			}
		}
		return out
	}})
}
