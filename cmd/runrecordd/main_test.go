package main

import (
	"os"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"runrecordd": func() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

// TestScripts runs the commands a user types, in testdata/script/*.txtar.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			b, err := os.ReadFile("../../testdata/records/sample.json")
			if err != nil {
				return err
			}
			return os.WriteFile(env.WorkDir+"/sample.json", b, 0o644)
		},
	})
}
