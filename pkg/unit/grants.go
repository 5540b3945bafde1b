package unit

import (
	"fmt"
	"path"
	"strings"
)

// Network is a grant set's network.
type Network uint8

// Networks.
const (
	NoNetwork Network = 1 // an empty network namespace, not even loopback up
	Loopback  Network = 2 // a private namespace with loopback only
	Egress    Network = 3 // loopback, and a link out to the destinations Grants.Egress allows
)

func (n Network) String() string {
	switch n {
	case NoNetwork:
		return "none"
	case Loopback:
		return "loopback"
	case Egress:
		return "egress"
	}
	return fmt.Sprintf("network(%d)", uint8(n))
}

// MarshalText writes the network's name ("" for the zero network, which a
// request leaves to the daemon's default).
func (n Network) MarshalText() ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	return []byte(n.String()), nil
}

// UnmarshalText reads a network's name; "" is the zero network.
func (n *Network) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*n = 0
		return nil
	}
	v, err := ParseNetwork(string(b))
	*n = v
	return err
}

// ParseNetwork parses "none", "loopback" or "egress".
func ParseNetwork(s string) (Network, error) {
	switch s {
	case "none", "":
		return NoNetwork, nil
	case "loopback":
		return Loopback, nil
	case "egress":
		return Egress, nil
	}
	return 0, fmt.Errorf("%w: network %q: want none, loopback or egress", ErrInvalid, s)
}

// Mount is a read-only bind mount of a host path.
type Mount struct {
	Source string `json:"source"` // absolute host path
	Target string `json:"target"` // absolute path in the sandbox
}

// Grants is what a unit may use.
type Grants struct {
	MilliCPU    uint32  `json:"milli_cpu"`    // CPU limit in thousandths of a core; 0 = unlimited
	MemoryBytes uint64  `json:"memory_bytes"` // memory limit; 0 = the daemon's default (docs/limits.md)
	Network     Network `json:"network"`
	ReadOnly    []Mount `json:"read_only"`        // read-only bind mounts
	Limits      Limits  `json:"limits"`           // caps; a zero field takes the daemon's default
	Egress      []Dest  `json:"egress,omitempty"` // with network egress: what it may reach, in SortDests order
	// Secrets are the names of the secrets the unit reads (files in
	// /run/secrets), in SortSecrets order; never their values, which
	// reach only the sandbox (docs/unit.md).
	Secrets []string `json:"secrets,omitempty"`
}

// Validate reports whether g can be granted.
func (g *Grants) Validate() error {
	switch g.Network {
	case NoNetwork, Loopback:
		if len(g.Egress) > 0 {
			return fmt.Errorf("%w: an egress list with network %s", ErrInvalid, g.Network)
		}
	case Egress:
		if _, err := appendEgress(nil, g.Egress); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: %s", ErrInvalid, g.Network)
	}
	if g.MemoryBytes != 0 && g.MemoryBytes < 4<<20 {
		return fmt.Errorf("%w: memory limit %d bytes is below 4 MiB", ErrInvalid, g.MemoryBytes)
	}
	if err := checkSecrets(g.Secrets); err != nil {
		return err
	}
	for _, m := range g.ReadOnly {
		if !path.IsAbs(m.Source) || !path.IsAbs(m.Target) || path.Clean(m.Target) != m.Target || m.Target == "/" {
			return fmt.Errorf("%w: mount %s:%s: paths must be absolute and clean, and not /", ErrInvalid, m.Source, m.Target)
		}
		if err := CheckSource(m.Source); err != nil {
			return err
		}
	}
	return nil
}

// forbiddenSources are the host trees no grant may mount, nor any path in
// them: the kernel's interfaces (/proc reaches every process's root, /sys
// and /dev the hardware) and /run, where the host's daemons keep their
// sockets.
var forbiddenSources = []string{"/proc", "/sys", "/dev", "/run"}

// CheckSource reports whether a read-only mount may have host path p as
// its source, by the path alone: absolute and clean, not the host's root,
// and not in a forbidden tree (/proc, /sys, /dev, /run). The executor
// checks the path again once it has resolved its symlinks, and also
// refuses the daemon's state directory, a directory holding it, and
// anything that is not a directory or a regular file (docs/trust.md).
func CheckSource(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("%w: mount source %s: not an absolute clean path", ErrInvalid, p)
	}
	if p == "/" {
		return fmt.Errorf("%w: %w: mount source /: the host's root is never granted", ErrInvalid, ErrSource)
	}
	for _, f := range forbiddenSources {
		if p == f || strings.HasPrefix(p, f+"/") {
			return fmt.Errorf("%w: %w: mount source %s: nothing under %s is ever granted", ErrInvalid, ErrSource, p, f)
		}
	}
	return nil
}
