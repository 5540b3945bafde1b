package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The module keeps its rules: this fails when a change breaks one.
func TestRulesHold(t *testing.T) {
	g, err := Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"pkg/record", "internal/daemon", "internal/server", "internal/fleet"} {
		if g[path] == nil {
			t.Fatalf("the graph has no %s: the rules would hold vacuously", path)
		}
	}
	var out strings.Builder
	if breaches := Report(&out, g); len(breaches) > 0 {
		t.Errorf("%d rules broken:\n%s", len(breaches), strings.Join(breaches, "\n"))
	}
	t.Logf("\n%s", out.String())
}

// graph builds a synthetic graph: each entry is "pkg imports...".
func graph(lines ...string) Graph {
	g := Graph{}
	for _, l := range lines {
		f := strings.Fields(l)
		g[f[0]] = &Package{Path: f[0], Imports: f[1:], Lines: 500}
	}
	if p := g[Hub.Path]; p != nil {
		p.Methods, p.Embeds = map[string]int{Hub.Type: MaxHubMethods}, map[string][]string{Hub.Type: {}}
	}
	return g
}

// A graph that keeps every rule, and one edit breaking each: the checker
// reports the broken rule, and only it.
func TestRulesCatchBreaks(t *testing.T) {
	good := []string{
		"cmd/runrecordd internal/server internal/fleet go.etcd.io/etcd/client/v3",
		"internal/server internal/daemon",
		"internal/daemon internal/store internal/fleet/member",
		"internal/fleet/member internal/fleet go.etcd.io/etcd/client/v3",
		"internal/fleet/peer go.etcd.io/etcd/api/v3",
		"internal/fleet pkg/record go.etcd.io/etcd/client/v3",
		"internal/etcdtest go.etcd.io/etcd/server/v3/embed",
		"internal/store pkg/record internal/atomicfile go.etcd.io/bbolt",
		"internal/atomicfile",
		"pkg/attest pkg/record",
		"pkg/record lukechampine.com/blake3",
	}
	if b := Check(graph(good...), Rules); len(b) > 0 {
		t.Fatalf("the good graph breaks rules: %v", b)
	}
	for _, c := range []struct {
		name, add string
		rule      int
	}{
		{"record imports the module", "pkg/record pkg/attest", 0},
		{"pkg imports internal", "pkg/attest pkg/record internal/atomicfile", 1},
		{"store imports etcd", "internal/store pkg/record go.etcd.io/etcd/client/v3", 2},
		{"a package outside the wing imports etcd", "internal/drainer go.etcd.io/etcd/client/v3", 2},
		{"a package beside the wing imports etcd", "internal/fleetish go.etcd.io/etcd/client/v3", 2},
		{"daemon imports server", "internal/daemon internal/store internal/server", 3},
		{"a room below the daemon imports server", "internal/store pkg/record internal/server", 3},
	} {
		g := graph(good...)
		maps.Copy(g, graph(c.add))
		var broken []int
		for i, r := range Rules {
			if len(r.Check(g)) > 0 {
				broken = append(broken, i)
			}
		}
		if !slices.Equal(broken, []int{c.rule}) {
			t.Errorf("%s: rules broken %v, want [%d] (%s)", c.name, broken, c.rule, Rules[c.rule].Name)
		}
	}
}

func TestMeasures(t *testing.T) {
	g := graph(
		"cmd/x a b",
		"a b c",
		"b c",
		"c d other.org/x",
		"d",
		"internal/small d",
		"internal/uses internal/small internal/shared",
		"internal/other internal/shared",
		"internal/shared",
		"internal/failpoint",
		"internal/onlytest internal/failpoint",
	)
	g["internal/small"].Lines = 199
	g["internal/shared"].Lines = 10
	g["internal/failpoint"].Lines = 10
	if got := strings.Join(LongestChain(g), " "); got != "cmd/x a b c d" {
		t.Errorf("longest chain %q, want cmd/x a b c d", got)
	}
	// d is imported by c and internal/small; internal/shared by two;
	// failpoint is test support; a is 500 lines.
	want := []Small{{"internal/small", 199, "internal/uses"}}
	if got := SmallSingles(g); !slices.Equal(got, want) {
		t.Errorf("small singles %v, want %v", got, want)
	}
	g["internal/small"].Lines = 200
	if got := SmallSingles(g); len(got) != 0 {
		t.Errorf("a package of 200 lines counted: %v", got)
	}
}

// Every pending breach is still a breach: one mended leaves the list.
func TestPendingStillBreak(t *testing.T) {
	g, err := Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	now := map[string]bool{}
	for _, b := range Check(g, Rules) {
		now[b] = true
	}
	for b := range Pending {
		if !now[b] {
			t.Errorf("mended, so no longer pending: remove it from pending.go: %s", b)
		}
	}
}

// The rules added with issue 34 each catch their breach on a synthetic
// graph: a chain of 9 packages, a small package with one importer, a
// function of 6 parameters.
func TestShapeRulesCatchBreaks(t *testing.T) {
	rule := func(prefix string) Rule {
		for _, r := range Rules {
			if strings.HasPrefix(r.Name, prefix) {
				return r
			}
		}
		t.Fatalf("no rule %q", prefix)
		return Rule{}
	}
	chain, small, params := rule("no chain of imports"), rule("no production package"), rule("no non-test function")

	eight := graph("p1 p2", "p2 p3", "p3 p4", "p4 p5", "p5 p6", "p6 p7", "p7 p8", "p8")
	if b := chain.Check(eight); len(b) > 0 {
		t.Errorf("a chain of 8 refused: %v", b)
	}
	nine := graph("p0 p1", "p1 p2", "p2 p3", "p3 p4", "p4 p5", "p5 p6", "p6 p7", "p7 p8", "p8")
	if b := chain.Check(nine); len(b) != 1 || !strings.HasPrefix(b[0], "9 packages: p0 -> p1") {
		t.Errorf("a chain of 9: %v", b)
	}

	g := graph("internal/a internal/frag", "internal/frag")
	if b := small.Check(g); len(b) > 0 {
		t.Errorf("a package of 500 lines counted: %v", b)
	}
	g["internal/frag"].Lines = 120
	if b := small.Check(g); !slices.Equal(b, []string{"internal/frag <- internal/a"}) {
		t.Errorf("a fragment of 120 lines: %v", b)
	}

	g = graph("internal/a")
	if b := params.Check(g); len(b) > 0 {
		t.Errorf("no wide function, yet: %v", b)
	}
	g["internal/a"].Wide = []string{"a.go f (6)"}
	if b := params.Check(g); !slices.Equal(b, []string{"internal/a/a.go f (6)"}) {
		t.Errorf("a function of 6 parameters: %v", b)
	}
}

// wide finds functions declared or literal of more than MaxParams
// parameters, counting each name of a grouped parameter and a variadic
// one as one, and ignoring the receiver.
func TestWide(t *testing.T) {
	src := `package p

type T struct{}

func five(a, b, c int, d string, e ...int) {}
func (T) fiveAndReceiver(a, b, c, d, e int) {}
func six(a, b, c, d, e, f int) {}
var lit = func(_ int, _ int, _ int, _ int, _ int, _ int) {}
`
	path := filepath.Join(t.TempDir(), "p.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := wide(path, "p.go")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"p.go six (6)", "p.go a func literal (6)"}; !slices.Equal(got, want) {
		t.Errorf("wide = %q, want %q", got, want)
	}
}

// The hub rule refuses a Daemon of more than MaxHubMethods methods, one
// that embeds a type, and a module without it, on a synthetic graph.
func TestHubRuleCatchesBreaks(t *testing.T) {
	var hub Rule
	for _, r := range Rules {
		if strings.HasPrefix(r.Name, Hub.Path+"'s "+Hub.Type) {
			hub = r
		}
	}
	if hub.Check == nil {
		t.Fatal("no hub rule")
	}
	g := graph(Hub.Path + " internal/store")
	if b := hub.Check(g); len(b) > 0 {
		t.Errorf("%d methods refused: %v", MaxHubMethods, b)
	}
	g[Hub.Path].Methods[Hub.Type] = MaxHubMethods + 1
	g[Hub.Path].Embeds[Hub.Type] = []string{"retention.Policy", "*evidence.Room"}
	want := []string{
		fmt.Sprintf("%s.%s has %d methods", Hub.Path, Hub.Type, MaxHubMethods+1),
		Hub.Path + "." + Hub.Type + " embeds retention.Policy",
		Hub.Path + "." + Hub.Type + " embeds *evidence.Room",
	}
	if b := hub.Check(g); !slices.Equal(b, want) {
		t.Errorf("breaches %q, want %q", b, want)
	}
	delete(g[Hub.Path].Embeds, Hub.Type)
	if b := hub.Check(g); len(b) != 1 || !strings.Contains(b[0], "no struct type") {
		t.Errorf("a hub without its type: %v", b)
	}
	delete(g, Hub.Path)
	if b := hub.Check(g); len(b) != 1 || !strings.Contains(b[0], "no package") {
		t.Errorf("a module without the hub's package: %v", b)
	}
}

// shape counts a file's methods by receiver type, pointer, value and
// generic alike, and lists each struct type's embedded types.
func TestShape(t *testing.T) {
	src := `package p

import "sync"

type T struct {
	sync.Mutex
	*U
	n int
}
type U struct{ a, b int }
type G[K comparable] struct{ m map[K]int }
type I interface{ M() }

func (T) a()       {}
func (*T) b()      {}
func (t *T) c()    {}
func (u U) d()     {}
func (g *G[K]) e() {}
func f()           {}
`
	path := filepath.Join(t.TempDir(), "p.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &Package{}
	if err := p.shape(path); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"T": 3, "U": 1, "G": 1}; !maps.Equal(p.Methods, want) {
		t.Errorf("methods %v, want %v", p.Methods, want)
	}
	if got := p.Embeds["T"]; !slices.Equal(got, []string{"sync.Mutex", "*U"}) {
		t.Errorf("T embeds %q", got)
	}
	if got, ok := p.Embeds["U"]; !ok || len(got) != 0 {
		t.Errorf("U embeds %q (listed: %v)", got, ok)
	}
	if _, ok := p.Embeds["I"]; ok {
		t.Error("an interface listed as a struct")
	}
}

// The Host rule refuses a third package declaring a struct type Host.
func TestHostRuleCatchesBreaks(t *testing.T) {
	var rule Rule
	for _, r := range Rules {
		if strings.Contains(r.Name, "struct type named Host") {
			rule = r
		}
	}
	if rule.Check == nil {
		t.Fatal("no Host rule")
	}
	g := graph("pkg/api", "internal/host", "internal/secrets", "bench/benchhost")
	for _, p := range []string{"pkg/api", "internal/host", "bench/benchhost"} {
		g[p].Embeds = map[string][]string{"Host": {}}
	}
	if b := rule.Check(g); len(b) > 0 {
		t.Errorf("two Host types refused: %v", b)
	}
	g["internal/secrets"].Embeds = map[string][]string{"Host": {}}
	want := []string{"3 packages declare Host: internal/host, internal/secrets, pkg/api"}
	if b := rule.Check(g); !slices.Equal(b, want) {
		t.Errorf("breaches %q, want %q", b, want)
	}
}
