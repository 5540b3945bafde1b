package daemon

import (
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
)

// TestLockRunUnknown: a request naming no run leaves no state behind.
func TestLockRunUnknown(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := &Daemon{st: st, runs: map[string]*run{}}
	for _, id := range []string{"nosuch", string(make([]byte, 4096))} {
		if _, err := d.lockRun(id); err == nil {
			t.Fatalf("lockRun(%.10q) found a run", id)
		}
	}
	if len(d.runs) != 0 {
		t.Fatalf("unknown ids left %d entries", len(d.runs))
	}
}

// The CRIU deadline is the configured one, or 30 s plus a second per
// 64 MiB moved.
func TestCRIUDeadline(t *testing.T) {
	d := &Daemon{}
	for mem, want := range map[uint64]time.Duration{0: 30 * time.Second, 64<<20 - 1: 30 * time.Second, 512 << 20: 38 * time.Second, 8 << 30: 158 * time.Second} {
		if got := d.criuDeadline(mem); got != want {
			t.Errorf("deadline for %d bytes: %v, want %v", mem, got, want)
		}
	}
	d.cfg.CRIUDeadline = 3 * time.Second
	if got := d.criuDeadline(8 << 30); got != 3*time.Second {
		t.Errorf("configured deadline: %v", got)
	}
}
