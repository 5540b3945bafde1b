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
