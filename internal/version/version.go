// Package version is this build's identity: the daemon's version, its
// source revision and the Go toolchain that built it, as `runrecordd
// version` prints them and runrecordd_build_info labels them.
package version

import (
	"runtime"
	"runtime/debug"
)

// version is set at link time (make build: -ldflags "-X
// github.com/runrecordd/runrecordd/internal/version.version=V"); empty,
// the module's version from the build info stands.
var version string

// Info is this build's identity.
type Info struct {
	// Version is the -ldflags version, else the main module's version
	// (a tag, a pseudo-version, or "(devel)" for a build in a checkout).
	Version string `json:"version"`
	// Revision is the VCS revision built, with "+dirty" when the tree
	// had uncommitted changes; empty when unknown.
	Revision string `json:"revision,omitempty"`
	Go       string `json:"go"`
}

// Get returns this build's identity.
func Get() Info {
	return get(version, debug.ReadBuildInfo)
}

func get(linked string, read func() (*debug.BuildInfo, bool)) Info {
	in := Info{Version: linked, Go: runtime.Version()}
	bi, ok := read()
	if !ok {
		if in.Version == "" {
			in.Version = "unknown"
		}
		return in
	}
	if in.Version == "" {
		in.Version = bi.Main.Version
	}
	if in.Version == "" {
		in.Version = "unknown"
	}
	if bi.GoVersion != "" {
		in.Go = bi.GoVersion
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if in.Revision != "" && dirty {
		in.Revision += "+dirty"
	}
	return in
}
