package bundle

import (
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A bundle's grants may not ask for more than this host's caps: a limit
// as large as it likes would switch the host's limits off.
func TestPolicyCapsLimits(t *testing.T) {
	p := &Policy{MaxLimits: DefaultMaxLimits, MaxMemoryBytes: 8 << 30, MaxMilliCPU: 2000}
	for name, g := range map[string]unit.Grants{
		"snapshot quota off": {Limits: unit.Limits{SnapshotBytes: 1<<64 - 1}},
		"pids":               {Limits: unit.Limits{Pids: 1 << 30}},
		"memory":             {MemoryBytes: 1 << 40},
		"cpu":                {MilliCPU: 64000},
	} {
		if err := p.Check(g); !errors.Is(err, ErrPolicy) {
			t.Errorf("%s: %v, want ErrPolicy", name, err)
		}
	}
	if err := p.Check(unit.Grants{MemoryBytes: 1 << 30, MilliCPU: 1000, Limits: unit.Limits{Pids: 64, SnapshotBytes: 1 << 30}}); err != nil {
		t.Fatalf("grants within the caps: %v", err)
	}
}
