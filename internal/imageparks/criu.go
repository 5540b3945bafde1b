package imageparks

import (
	"slices"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// Build is what the gate asks of the CRIU build the daemon runs
// (criu.Build): what it can do, as recorded, and why not.
type Build interface {
	Has(criu.Capability) bool
	Lacks(criu.Capability) string
}

// seeable are the capabilities a probe can see at work (executor's
// probe_criu.go): the in-process tmpfs dump and restore.
var seeable = []criu.Capability{criu.TmpfsDump, criu.TmpfsRestore}

// CheckBuild adds to a probe that succeeded what it found of the CRIU
// build: for each capability a probe can see at work, whether it was, and
// where the build's record and the probe disagree, that the probe is
// believed (a note; these capabilities gate no fast path, only how long
// a park and a resume take).
func CheckBuild(p criu.Probe, b Build) criu.Probe {
	if !p.OK {
		return p
	}
	p.Notes = slices.Clone(p.Notes)
	for _, c := range seeable {
		seen := slices.Contains(p.Seen, c)
		switch {
		case seen && b.Has(c):
			p.Notes = append(p.Notes, string(c)+": CRIU does it in its own process (deploy/criu/"+criu.Patch(c)+")")
		case seen:
			p.Notes = append(p.Notes, string(c)+": seen at work, though the build is not known to carry deploy/criu/"+criu.Patch(c))
		case b.Has(c):
			p.Notes = append(p.Notes, string(c)+": the build carries deploy/criu/"+criu.Patch(c)+" but the probe's CRIU forked tar: parks and resumes fork tar and gzip for each tmpfs")
		default:
			p.Notes = append(p.Notes, string(c)+": off, CRIU forks tar and gzip for each tmpfs: "+b.Lacks(c))
		}
	}
	return p
}

// UserNS applies the host's policy to a probe that also tried a dump and
// restore in a user namespace (criu.Probe.UserNSTried): passed, image
// units run in user namespaces; failed, they run as the host's root only
// where the operator accepts it (hostRoot: serve --allow-host-root-images),
// and otherwise image parks are unavailable, the reason saying so.
func UserNS(p criu.Probe, hostRoot bool) criu.Probe {
	if !p.OK || !p.UserNSTried {
		return p
	}
	p.Notes = slices.Clone(p.Notes)
	switch {
	case p.UserNS:
		p.Notes = append(p.Notes, "image units run in user namespaces: a dump and restore in one passed")
	case hostRoot:
		p.Notes = append(p.Notes, "image units run as the host's root (serve --allow-host-root-images): a dump and restore in a user namespace failed: "+p.UserNSReason)
	default:
		p.OK = false
		p.Reason = "a dump and restore in a user namespace failed, and image units do not run as the host's root unless serve --allow-host-root-images accepts it: " + p.UserNSReason
	}
	return p
}
