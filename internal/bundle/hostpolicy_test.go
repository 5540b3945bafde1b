package bundle

import (
	"runtime"
	"slices"
	"testing"
)

// The host's policy allows mounts under the configured paths only, never
// of the state directory, caps limits at DefaultMaxLimits, and memory and
// CPU at the host's.
func TestHostPolicy(t *testing.T) {
	mounts := []string{"/srv/data"}
	p := HostPolicy(mounts, "/var/lib/runrecordd")
	if !slices.Equal(p.AllowMounts, mounts) || p.StateDir != "/var/lib/runrecordd" || p.MaxLimits != DefaultMaxLimits {
		t.Fatalf("HostPolicy = %+v", p)
	}
	if p.MaxMilliCPU != uint32(runtime.NumCPU())*1000 {
		t.Errorf("MaxMilliCPU = %d on %d CPUs", p.MaxMilliCPU, runtime.NumCPU())
	}
	mem, err := hostMemory()
	if err != nil {
		t.Fatalf("this Linux host's /proc/meminfo: %v", err)
	}
	if p.MaxMemoryBytes != mem || mem == 0 {
		t.Errorf("MaxMemoryBytes = %d, the host has %d", p.MaxMemoryBytes, mem)
	}
}
