// Command rooms checks the module's standing dependency rules and prints
// its measures (docs/rooms.md, "Measures"): the longest chain of imports
// between the module's packages, the daemon's methods, and the production
// packages under 200 lines that only one package imports. It reads the import graph with
// `go list -deps -f` and exits 1 when a rule is broken.
//
//	go run ./tools/rooms        # from the module's root
package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Module is this module's path.
const Module = "github.com/runrecordd/runrecordd"

// Package is one of the module's packages, as its production (non-test)
// files build it.
type Package struct {
	Path    string   // import path, without the module's prefix ("pkg/record")
	Imports []string // every import: the module's without its prefix, others in full
	Lines   int      // lines of its non-test Go files
	// Wide are its non-test functions (declared or literal) that take
	// more than MaxParams parameters besides a receiver, each as
	// "file name (n)".
	Wide []string
	// Methods counts the methods its non-test files declare, by receiver
	// type name (pointer receiver or not).
	Methods map[string]int
	// Embeds holds each struct type its non-test files declare, by name,
	// with the types it embeds (none: an empty list).
	Embeds map[string][]string
	// CRIU are the places its non-test files speak CRIU (speaksCRIU).
	CRIU []string
}

// MaxParams is the most parameters a non-test function takes besides its
// receiver; more go in a small options struct.
const MaxParams = 5

// wide returns the functions of a Go file that take more than MaxParams
// parameters besides a receiver.
func wide(path, name string) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		var ft *ast.FuncType
		fn := "a func literal"
		switch x := n.(type) {
		case *ast.FuncDecl:
			ft, fn = x.Type, x.Name.Name
		case *ast.FuncLit:
			ft = x.Type
		default:
			return true
		}
		count := 0
		for _, field := range ft.Params.List {
			count += max(1, len(field.Names))
		}
		if count > MaxParams {
			out = append(out, fmt.Sprintf("%s %s (%d)", name, fn, count))
		}
		return true
	})
	return out, nil
}

// shape adds the methods and the struct types of a Go file to p.
func (p *Package) shape(path string) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return err
	}
	if p.Methods == nil {
		p.Methods, p.Embeds = map[string]int{}, map[string][]string{}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv != nil && len(d.Recv.List) == 1 {
				p.Methods[receiver(d.Recv.List[0].Type)]++
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				ts, ok := spec.(*ast.TypeSpec)
				if !ok {
					continue
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				embeds := []string{}
				for _, field := range st.Fields.List {
					if len(field.Names) == 0 {
						embeds = append(embeds, types.ExprString(field.Type))
					}
				}
				p.Embeds[ts.Name.Name] = embeds
			}
		}
	}
	return nil
}

// receiver is the type name of a method's receiver: T of T, *T, T[P]
// and *T[P].
func receiver(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return types.ExprString(e)
		}
	}
}

// Graph is the module's packages by Path.
type Graph map[string]*Package

// Load reads the graph of the module rooted at dir with go list.
func Load(dir string) (Graph, error) {
	cmd := exec.Command("go", "list", "-deps", "-f",
		"{{if not .Standard}}{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \" \"}}\t{{join .Imports \" \"}}{{end}}", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.Bytes())
	}
	g := Graph{}
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(f) != 4 || (f[0] != Module && !strings.HasPrefix(f[0], Module+"/")) {
			continue
		}
		p := &Package{Path: local(f[0])}
		for _, imp := range strings.Fields(f[3]) {
			p.Imports = append(p.Imports, local(imp))
		}
		for _, name := range strings.Fields(f[2]) {
			b, err := os.ReadFile(filepath.Join(f[1], name))
			if err != nil {
				return nil, err
			}
			p.Lines += bytes.Count(b, []byte("\n"))
			w, err := wide(filepath.Join(f[1], name), name)
			if err != nil {
				return nil, err
			}
			p.Wide = append(p.Wide, w...)
			c, err := speaksCRIU(filepath.Join(f[1], name), name)
			if err != nil {
				return nil, err
			}
			p.CRIU = append(p.CRIU, c...)
			if err := p.shape(filepath.Join(f[1], name)); err != nil {
				return nil, err
			}
		}
		g[p.Path] = p
	}
	if len(g) == 0 {
		return nil, fmt.Errorf("go list in %s: none of %s's packages", dir, Module)
	}
	return g, nil
}

// local strips the module's prefix from an import path of the module.
func local(path string) string {
	if path == Module {
		return "."
	}
	if rest, ok := strings.CutPrefix(path, Module+"/"); ok {
		return rest
	}
	return path
}

// ours reports whether an import path (as Package.Imports holds it) is
// one of the module's.
func (g Graph) ours(path string) bool { _, ok := g[path]; return ok }

// under reports whether path is dir or inside it.
func under(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }

// Rule is a standing dependency rule: Check returns one line per breach.
type Rule struct {
	Name  string
	Check func(Graph) []string
}

// EtcdImporters are the packages that may import go.etcd.io/etcd: the
// fleet wing (internal/fleet, the directory, and the packages under it),
// the test cluster, and cmd/.
var EtcdImporters = []string{"internal/fleet", "internal/etcdtest", "cmd"}

// Rules are the module's standing rules.
var Rules = []Rule{
	{"pkg/record imports nothing of this module", func(g Graph) []string {
		var out []string
		for _, imp := range g["pkg/record"].imports() {
			if g.ours(imp) {
				out = append(out, "pkg/record imports "+imp)
			}
		}
		return out
	}},
	{"pkg/ imports nothing from internal/", func(g Graph) []string {
		var out []string
		for _, p := range g.sorted() {
			for _, imp := range p.Imports {
				if under(p.Path, "pkg") && under(imp, "internal") {
					out = append(out, p.Path+" imports "+imp)
				}
			}
		}
		return out
	}},
	{"only " + strings.Join(EtcdImporters, ", ") + " import go.etcd.io/etcd", func(g Graph) []string {
		var out []string
		for _, p := range g.sorted() {
			allowed := slices.ContainsFunc(EtcdImporters, func(d string) bool { return under(p.Path, d) })
			for _, imp := range p.Imports {
				if !allowed && strings.HasPrefix(imp, "go.etcd.io/etcd/") {
					out = append(out, p.Path+" imports "+imp)
				}
			}
		}
		return out
	}},
	{"nothing below internal/daemon imports internal/server", func(g Graph) []string {
		var out []string
		for _, path := range g.deps("internal/daemon") {
			if slices.Contains(g[path].Imports, "internal/server") {
				out = append(out, path+" imports internal/server")
			}
		}
		return out
	}},
}

// MaxChain is the most packages a chain of imports between the module's
// packages holds, counting both ends.
const MaxChain = 8

func init() {
	Rules = append(Rules,
		Rule{fmt.Sprintf("no chain of imports holds more than %d packages", MaxChain), func(g Graph) []string {
			if c := LongestChain(g); len(c) > MaxChain {
				return []string{fmt.Sprintf("%d packages: %s", len(c), strings.Join(c, " -> "))}
			}
			return nil
		}},
		Rule{fmt.Sprintf("no production package under %d lines is imported by one package only", SmallLines), func(g Graph) []string {
			var out []string
			for _, s := range SmallSingles(g) {
				out = append(out, s.Path+" <- "+s.Importer)
			}
			return out
		}},
		Rule{fmt.Sprintf("no non-test function takes more than %d parameters besides its receiver", MaxParams), func(g Graph) []string {
			var out []string
			for _, p := range g.sorted() {
				for _, w := range p.Wide {
					out = append(out, p.Path+"/"+w)
				}
			}
			return out
		}},
	)
}

// Hub is the type that reads as the list of what a host does: its
// methods are the host's verbs, at most MaxHubMethods of them, and none
// comes from a type it embeds (the rooms it uses are fields, wired once).
var Hub = struct{ Path, Type string }{"internal/daemon", "Daemon"}

// MaxHubMethods is the most methods Hub's type declares.
const MaxHubMethods = 40

func init() {
	Rules = append(Rules, Rule{fmt.Sprintf("%s's %s declares at most %d methods and embeds nothing", Hub.Path, Hub.Type, MaxHubMethods), func(g Graph) []string {
		p, name := g[Hub.Path], Hub.Path+"."+Hub.Type
		if p == nil {
			return []string{"no package " + Hub.Path}
		}
		embeds, ok := p.Embeds[Hub.Type]
		if !ok {
			return []string{"no struct type " + name}
		}
		var out []string
		if n := p.Methods[Hub.Type]; n > MaxHubMethods {
			out = append(out, fmt.Sprintf("%s has %d methods", name, n))
		}
		for _, e := range embeds {
			out = append(out, name+" embeds "+e)
		}
		return out
	}})
}

// Pending are breaches known when a rule was added, each owned by work
// under way: they are reported, not counted, and TestRulesHold fails once
// one is mended and still listed here, so the list only shrinks.
var Pending = map[string]bool{}

// Check returns every breach of rules in g, each prefixed by its rule.
func Check(g Graph, rules []Rule) []string {
	var out []string
	for _, r := range rules {
		for _, b := range r.Check(g) {
			out = append(out, r.Name+": "+b)
		}
	}
	return out
}

func (p *Package) imports() []string {
	if p == nil {
		return nil
	}
	return p.Imports
}

func (g Graph) sorted() []*Package {
	out := make([]*Package, 0, len(g))
	for _, p := range g {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Package) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// deps returns path and every package of the module it imports,
// directly or not, sorted.
func (g Graph) deps(path string) []string {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(p string) {
		if seen[p] || !g.ours(p) {
			return
		}
		seen[p] = true
		for _, imp := range g[p].Imports {
			walk(imp)
		}
	}
	walk(path)
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// LongestChain returns a longest chain of imports between the module's
// packages, the importer first (ties broken by path). Its length counts
// both ends.
func LongestChain(g Graph) []string {
	memo := map[string][]string{}
	onPath := map[string]bool{} // a synthetic graph may have a cycle; Go's never do
	var from func(string) []string
	from = func(p string) []string {
		if c, ok := memo[p]; ok {
			return c
		}
		onPath[p] = true
		defer delete(onPath, p)
		var best []string
		imps := slices.Clone(g[p].imports())
		slices.Sort(imps)
		for _, imp := range imps {
			if !g.ours(imp) || onPath[imp] {
				continue
			}
			if c := from(imp); len(c) > len(best) {
				best = c
			}
		}
		memo[p] = append([]string{p}, best...)
		return memo[p]
	}
	var best []string
	for _, p := range g.sorted() {
		if c := from(p.Path); len(c) > len(best) {
			best = c
		}
	}
	return best
}

// Small is a production package under SmallLines lines that only one of
// the module's packages imports.
type Small struct {
	Path     string
	Lines    int
	Importer string
}

// SmallLines is the size below which a package imported by one other is
// counted as a fragment of it.
const SmallLines = 200

// counted reports whether a package counts as production for
// SmallSingles: not test support (test/, tools/, internal/failpoint, the
// packages named *test or test*), not a command (cmd/), and not the
// module's root, which exists only to embed testdata/ (go:embed reads no
// parent directory).
func counted(path string) bool {
	base := filepath.Base(path)
	return !under(path, "test") && !under(path, "tools") && !under(path, "cmd") && path != "." &&
		path != "internal/failpoint" && !strings.HasSuffix(base, "test") && !strings.HasPrefix(base, "test")
}

// SmallSingles returns the production packages under SmallLines lines
// that exactly one package of the module imports, sorted.
func SmallSingles(g Graph) []Small {
	importers := map[string][]string{}
	for _, p := range g.sorted() {
		for _, imp := range p.Imports {
			if g.ours(imp) {
				importers[imp] = append(importers[imp], p.Path)
			}
		}
	}
	var out []Small
	for _, p := range g.sorted() {
		if by := importers[p.Path]; len(by) == 1 && p.Lines < SmallLines && counted(p.Path) {
			out = append(out, Small{p.Path, p.Lines, by[0]})
		}
	}
	return out
}

// Report writes the rules' verdict and the measures to w, and returns the
// breaches that are not Pending.
func Report(w io.Writer, g Graph) []string {
	var breaches, pending []string
	for _, b := range Check(g, Rules) {
		if Pending[b] {
			pending = append(pending, b)
		} else {
			breaches = append(breaches, b)
		}
	}
	fmt.Fprintf(w, "packages: %d\n", len(g))
	if len(breaches) == 0 {
		fmt.Fprintf(w, "rules: all %d hold (%d breaches pending)\n", len(Rules), len(pending))
	}
	for _, b := range breaches {
		fmt.Fprintf(w, "rule broken: %s\n", b)
	}
	for _, b := range pending {
		fmt.Fprintf(w, "pending: %s\n", b)
	}
	chain := LongestChain(g)
	fmt.Fprintf(w, "longest import chain: %d packages\n  %s\n", len(chain), strings.Join(chain, " -> "))
	if p := g[Hub.Path]; p != nil {
		fmt.Fprintf(w, "%s.%s methods: %d (at most %d)\n", Hub.Path, Hub.Type, p.Methods[Hub.Type], MaxHubMethods)
	}
	small := SmallSingles(g)
	fmt.Fprintf(w, "production packages under %d lines imported by one package: %d\n", SmallLines, len(small))
	for _, s := range small {
		fmt.Fprintf(w, "  %s (%d lines) <- %s\n", s.Path, s.Lines, s.Importer)
	}
	return breaches
}

func main() {
	g, err := Load(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "rooms:", err)
		os.Exit(2)
	}
	if len(Report(os.Stdout, g)) > 0 {
		os.Exit(1)
	}
}

// MaxHostTypes is the most packages of internal/ and pkg/ that declare a
// struct type named Host: one word, one meaning (the host's own state,
// and its view in the API); a room's type is named for what it is.
const MaxHostTypes = 2

func init() {
	Rules = append(Rules, Rule{fmt.Sprintf("at most %d packages of internal/ and pkg/ declare a struct type named Host", MaxHostTypes), func(g Graph) []string {
		var in []string
		for path, p := range g {
			room := strings.HasPrefix(path, "internal/") || strings.HasPrefix(path, "pkg/")
			if _, ok := p.Embeds["Host"]; ok && room {
				in = append(in, path)
			}
		}
		if len(in) <= MaxHostTypes {
			return nil
		}
		slices.Sort(in)
		return []string{fmt.Sprintf("%d packages declare Host: %s", len(in), strings.Join(in, ", "))}
	}})
}
