package daemon

import (
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
)

// TestLockRunUnknown: a request naming no run leaves no state behind.
func TestLockRunUnknown(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	runs := &runTable{st: st}
	for _, id := range []string{"nosuch", string(make([]byte, 4096))} {
		if _, err := runs.lockRun(id); err == nil {
			t.Fatalf("lockRun(%.10q) found a run", id)
		}
	}
	if n := len(runs.all()); n != 0 {
		t.Fatalf("unknown ids left %d entries", n)
	}
}
