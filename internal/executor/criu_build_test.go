//go:build linux

package executor_test

import (
	"os"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// criuBuild is the CRIU build the tests run (internal/criu): the criu on
// PATH, with the manifest deploy/setup.sh installs, or the one
// RUNRECORDD_CRIU_BUILD names (for a CRIU built by hand).
func criuBuild(t *testing.T) criu.Build {
	t.Helper()
	manifest := os.Getenv("RUNRECORDD_CRIU_BUILD")
	if manifest == "" {
		manifest = criu.BuildFile
	}
	b, err := criu.Identify(client.Config().CRIU, manifest)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// needsPatch skips t, naming the deploy/criu patch, when the CRIU the
// tests run cannot do c: on a host set up by deploy/setup.sh every patch
// is there and t runs.
func needsPatch(t *testing.T, c criu.Capability) {
	t.Helper()
	if why := criuBuild(t).Lacks(c); why != "" {
		t.Skip(why)
	}
}
