package bundle

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Forbidden are the mount sources no bundle is granted, whatever the
// allow-list says: the host's root and its kernel and device trees. A
// source equal to one of them, under one, or above one is refused.
var Forbidden = []string{"/", "/proc", "/sys", "/dev"}

// Policy is how the importing host judges a bundle's grant set: the grants
// are a request, not an order (docs/trust.md).
type Policy struct {
	// AllowMounts are the host paths under which a bundle's read-only
	// mount sources may lie (each path itself included). Empty: a bundle
	// may mount nothing of this host.
	AllowMounts []string
	// StateDir is the daemon's state directory: never mounted, nor any
	// directory above it.
	StateDir string
	// MaxLimits caps every limit a bundle's grants may ask for (a zero
	// field caps nothing); MaxMemoryBytes and MaxMilliCPU cap its memory
	// and CPU (0: no cap). A bundle asking for more is refused: its
	// grants are a request, and a limit as large as it likes would switch
	// this host's limits off (limits.snapshot_bytes of 2^64-1).
	MaxLimits      unit.Limits
	MaxMemoryBytes uint64
	MaxMilliCPU    uint32
	// EgressAllow is the host's egress ceiling: the IPv4 prefixes an
	// egress grant's prefixes must lie within. Empty: no egress grant is
	// taken (CheckEgress).
	EgressAllow []netip.Prefix
	// EgressNames: the host resolves names for its runs (serve
	// --egress-resolver), so an egress grant may name destinations.
	EgressNames bool
}

// CheckEgress refuses, with an error wrapping [ErrPolicy], a grant set with
// network egress that asks beyond ceiling: any egress when ceiling is
// empty, else a prefix not within one of ceiling's, or a destination by
// name unless names (the host has a resolver; each address a name
// resolves to is held to ceiling when it is answered).
func CheckEgress(g unit.Grants, ceiling []netip.Prefix, names bool) error {
	if g.Network != unit.Egress {
		return nil
	}
	if len(ceiling) == 0 {
		return fmt.Errorf("%w: network egress: this host grants no egress", ErrPolicy)
	}
	for _, d := range g.Egress {
		if d.CIDR == "" {
			if !names {
				return fmt.Errorf("%w: egress destination %s: this host resolves no names (serve --egress-resolver)", ErrPolicy, d)
			}
			continue
		}
		p, err := netip.ParsePrefix(d.CIDR)
		if err != nil {
			return fmt.Errorf("%w: egress destination %s: %v", ErrPolicy, d, err)
		}
		if !slices.ContainsFunc(ceiling, func(c netip.Prefix) bool { return c.Bits() <= p.Bits() && c.Contains(p.Addr()) }) {
			return fmt.Errorf("%w: egress destination %s: outside this host's egress ceiling", ErrPolicy, d)
		}
	}
	return nil
}

// DefaultMaxLimits are the largest limits a bundle may ask for: sixteen
// times each of the daemon's defaults.
var DefaultMaxLimits = unit.Limits{
	Pids:                 16 * unit.DefaultLimits.Pids,
	LogBytes:             16 * unit.DefaultLimits.LogBytes,
	TranscriptBytes:      16 * unit.DefaultLimits.TranscriptBytes,
	ChannelConns:         16 * unit.DefaultLimits.ChannelConns,
	ChannelInflightBytes: 16 * unit.DefaultLimits.ChannelInflightBytes,
	IntervalCalls:        16 * unit.DefaultLimits.IntervalCalls,
	IntervalPayloadBytes: 16 * unit.DefaultLimits.IntervalPayloadBytes,
	SnapshotBytes:        16 * unit.DefaultLimits.SnapshotBytes,
}

// within reports whether p is dir or below it; both clean and absolute.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// Check refuses, with an error wrapping [ErrPolicy] that names the mount,
// a grant set that mounts a source the policy does not allow: one outside
// the allow-list, one reached through a symbolic link, a forbidden tree,
// the state directory (or a directory above it), or a socket.
func (p *Policy) Check(g unit.Grants) error {
	over := func(name string, asked, max uint64) error {
		if max != 0 && asked > max {
			return fmt.Errorf("%w: %s of %d asked, this host grants a bundle at most %d", ErrPolicy, name, asked, max)
		}
		return nil
	}
	l, m := g.Limits, p.MaxLimits
	for _, c := range []struct {
		name       string
		asked, max uint64
	}{
		{"memory_bytes", g.MemoryBytes, p.MaxMemoryBytes},
		{"milli_cpu", uint64(g.MilliCPU), uint64(p.MaxMilliCPU)},
		{"limits.pids", uint64(l.Pids), uint64(m.Pids)},
		{"limits.log_bytes", l.LogBytes, m.LogBytes},
		{"limits.transcript_bytes", l.TranscriptBytes, m.TranscriptBytes},
		{"limits.channel_conns", uint64(l.ChannelConns), uint64(m.ChannelConns)},
		{"limits.channel_inflight_bytes", l.ChannelInflightBytes, m.ChannelInflightBytes},
		{"limits.interval_calls", uint64(l.IntervalCalls), uint64(m.IntervalCalls)},
		{"limits.interval_payload_bytes", l.IntervalPayloadBytes, m.IntervalPayloadBytes},
		{"limits.snapshot_bytes", l.SnapshotBytes, m.SnapshotBytes},
	} {
		if err := over(c.name, c.asked, c.max); err != nil {
			return err
		}
	}
	if err := CheckEgress(g, p.EgressAllow, p.EgressNames); err != nil {
		return err
	}
	for _, m := range g.ReadOnly {
		if err := p.mount(m.Source); err != nil {
			return fmt.Errorf("%w: read-only mount %s:%s: %v", ErrPolicy, m.Source, m.Target, err)
		}
	}
	return nil
}

func (p *Policy) mount(src string) error {
	src = filepath.Clean(src)
	if !filepath.IsAbs(src) {
		return fmt.Errorf("the source is not an absolute path")
	}
	for _, f := range Forbidden {
		if src == "/" || (f != "/" && (within(src, f) || within(f, src))) {
			return fmt.Errorf("%s is never mounted from a bundle", f)
		}
	}
	if p.StateDir != "" {
		sd := filepath.Clean(p.StateDir)
		if within(src, sd) || within(sd, src) {
			return fmt.Errorf("the daemon's state directory %s is never mounted", sd)
		}
	}
	allowed := false
	for _, a := range p.AllowMounts {
		if within(src, filepath.Clean(a)) {
			allowed = true
		}
	}
	if !allowed {
		if len(p.AllowMounts) == 0 {
			return fmt.Errorf("this host allows no mounts from bundles (serve --bundle-mount-allow)")
		}
		return fmt.Errorf("not under an allowed source (%s)", strings.Join(p.AllowMounts, ", "))
	}
	// The path as resolved now must be the path as named: a link inside
	// an allowed tree could lead anywhere.
	real, err := filepath.EvalSymlinks(src)
	if err != nil {
		return err
	}
	if real != src {
		return fmt.Errorf("the path goes through a symbolic link (to %s)", real)
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if st.Mode()&(os.ModeSocket|os.ModeNamedPipe|os.ModeDevice) != 0 {
		return fmt.Errorf("a socket, FIFO or device is never mounted from a bundle")
	}
	return nil
}
