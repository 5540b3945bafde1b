package bundle

import (
	"fmt"
	"os"
	"path/filepath"
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
