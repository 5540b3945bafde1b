package executor

import (
	"os"
	"path/filepath"
	"testing"
)

// A bundle whose deletion was cut between its rename and its removal
// (.ID) is removed before containerd starts; live bundles stay. Seen
// failing first (no sweep): containerd could not delete the next bundle
// of that id, and no task of it could be made (TestLazyFaults in CI).
func TestSweepDeletedBundles(t *testing.T) {
	state := t.TempDir()
	ns := filepath.Join(state, "io.containerd.runtime.v2.task", "runrecordd")
	for _, d := range []string{".cut", "live", ".cut2/rootfs"} {
		if err := os.MkdirAll(filepath.Join(ns, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ns, ".notadir"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := sweepDeletedBundles(state)
	if len(got) != 2 {
		t.Fatalf("removed %v, want .cut and .cut2", got)
	}
	for _, d := range []string{".cut", ".cut2"} {
		if _, err := os.Stat(filepath.Join(ns, d)); !os.IsNotExist(err) {
			t.Fatalf("%s stays: %v", d, err)
		}
	}
	for _, d := range []string{"live", ".notadir"} {
		if _, err := os.Stat(filepath.Join(ns, d)); err != nil {
			t.Fatalf("%s removed: %v", d, err)
		}
	}
}
