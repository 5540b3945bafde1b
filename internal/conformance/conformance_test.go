package conformance

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

const pack = "../../testdata/conformance"

func TestPack(t *testing.T) {
	classes, err := Load(pack)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range classes {
		names = append(names, c.Class)
		if res := Run(c); !res.Passed() {
			t.Errorf("%s failed:\n%s", c.Class, strings.Join(res.Failed, "\n"))
		}
	}
	if got := strings.Join(names, ","); got != "C6,C14,C15" {
		t.Fatalf("classes %s, want C6,C14,C15", got)
	}
}

// The checked-in vectors are exactly what the generator writes today.
func TestPackIsGenerated(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("go", "run", "./gen", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	for _, f := range []string{"c6.json", "c14.json", "c15.json", "sample.json"} {
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		src := filepath.Join(pack, f)
		if f == "sample.json" {
			src = "../../testdata/records/sample.json"
		}
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the generator's output: run go run ./internal/conformance/gen", f)
		}
	}
}

// A runner that passes everything would pass this pack too; these edits
// must each fail a class.
func TestRunnerCatchesBrokenVectors(t *testing.T) {
	classes, err := Load(pack)
	if err != nil {
		t.Fatal(err)
	}
	for _, edit := range []struct {
		name string
		fn   func(c *Class)
	}{
		{"wrong head", func(c *Class) { h := record.Sum([]byte("x")); c.Cases[0].Head = &h }},
		{"wrong expectation", func(c *Class) { c.Cases[0].Steps[0].Expect = "SnapshotMismatch" }},
		{"wrong idle", func(c *Class) {
			for i := range c.Cases {
				if c.Cases[i].IdleUJ != nil {
					v := *c.Cases[i].IdleUJ + 1
					c.Cases[i].IdleUJ = &v
				}
			}
		}},
		{"no cases", func(c *Class) { c.Cases = nil }},
	} {
		for _, c := range classes {
			cp := c
			cp.Cases = append([]Case(nil), c.Cases...)
			if len(cp.Cases) > 0 {
				cp.Cases[0].Steps = append([]Step(nil), c.Cases[0].Steps...)
			}
			if edit.name == "wrong idle" && c.Class == "C15" {
				continue // C15 states no idle totals
			}
			edit.fn(&cp)
			if Run(cp).Passed() {
				t.Errorf("%s: %s still passes", edit.name, c.Class)
			}
		}
	}
}

// The runner reads vectors as strictly as DecodeWire reads a record: a
// segment missing a key of its kind, an unknown outcome name or key, or a
// case that checks nothing is refused at load, never read as a default.
func TestLoadIsStrict(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(pack, "c15.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := load(t, b); err != nil {
		t.Fatalf("the checked-in file: %v", err)
	}
	for _, e := range []struct{ name, old, new string }{
		{"missing resolved list", `"resolved": []`, `"x": []`},
		{"resolved list dropped", "],\n              \"resolved\": []", "]"},
		{"null dispatched list", `"dispatched": []`, `"dispatched": null`},
		{"unknown outcome", `"expect": "ok"`, `"expect": "fine"`},
		{"unknown key", `"expect": "ok"`, `"expect": "ok", "note": 1`},
		{"class name", `"class": "C15"`, `"class": "C15a"`},
		{"trailing data", "}\n", "}\n{}"},
		{"key twice", `"expect": "ok"`, `"expect": "Closed", "expect": "ok"`},
		{"key in another case", `"expect": "ok"`, `"Expect": "ok"`},
	} {
		if !bytes.Contains(b, []byte(e.old)) {
			t.Fatalf("%s: %q not in c15.json", e.name, e.old)
		}
		if _, err := load(t, bytes.Replace(b, []byte(e.old), []byte(e.new), 1)); err == nil {
			t.Errorf("%s: loaded", e.name)
		}
	}
}

func load(t *testing.T, b []byte) ([]Class, error) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c15.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return Load(dir)
}
