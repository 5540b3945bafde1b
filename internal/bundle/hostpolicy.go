package bundle

import (
	"fmt"
	"runtime"

	"github.com/prometheus/procfs"
)

// Intake is what a host lets an imported bundle bring (serve's bundle
// flags, docs/limits.md and docs/trust.md).
type Intake struct {
	// BundleLimits cap what one imported bundle may cost; a zero field
	// takes DefaultLimits.
	BundleLimits Limits
	// BundleMounts are the host paths under which an imported bundle's
	// read-only mount sources may lie; empty allows none.
	BundleMounts []string
}

// HostPolicy is this host's policy for the grants an imported bundle asks
// for: read-only mounts only under mounts and never of stateDir, every
// limit at most DefaultMaxLimits, memory at most the host's RAM (no cap
// when /proc/meminfo does not say), and CPU at most the host's CPUs.
func HostPolicy(mounts []string, stateDir string) *Policy {
	p := &Policy{AllowMounts: mounts, StateDir: stateDir, MaxLimits: DefaultMaxLimits,
		MaxMilliCPU: uint32(runtime.NumCPU()) * 1000}
	if mem, err := hostMemory(); err == nil {
		p.MaxMemoryBytes = mem
	}
	return p
}

// hostMemory is the host's RAM, from /proc/meminfo.
func hostMemory() (uint64, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, err
	}
	mi, err := fs.Meminfo()
	if err != nil {
		return 0, err
	}
	if mi.MemTotalBytes == nil || *mi.MemTotalBytes == 0 {
		return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
	}
	return *mi.MemTotalBytes, nil
}
