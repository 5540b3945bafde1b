package main

import (
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
		f := strings.Fields(c.add)
		g[f[0]] = &Package{Path: f[0], Imports: f[1:]}
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
