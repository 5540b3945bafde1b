package host

import (
	"github.com/runrecordd/runrecordd/internal/criu"
)

// identifyCRIU finds the CRIU build the executor runs (its manifest and
// what it can do: internal/criu) and turns off each fast path it cannot
// take, saying why in the log: `--lazy-served` needs lazy-pages to keep
// every task's userfaultfd (deploy/criu/2-lazy-pages-keep-uffds.patch).
// A CRIU that did not answer at start is not looked at: no image parks
// here at all.
func (h *Host) identifyCRIU() {
	log := h.Config.Logger
	if h.CRIUErr != nil {
		return
	}
	manifest := h.Config.CRIUBuild
	if manifest == "" {
		manifest = criu.BuildFile
	}
	b, err := criu.Identify(h.Exec.Config().CRIU, manifest)
	if err != nil {
		log.Warn("CRIU build: the binary could not be read; every fast path that needs a patch is off", "err", err)
	}
	h.CRIU = b
	if b.Record == nil {
		// Info: nothing is off until a flag asks for a fast path (below).
		log.Info("CRIU build not known: the fast paths that need a deploy/criu patch without a mark in the binary are off (deploy/setup.sh installs a known one)",
			"criu", b.Binary, "why", b.Unknown, "patches", b.Patches())
	} else {
		log.Info("CRIU build", "criu", b.Binary, "version", b.Record.Version, "patches", b.Patches())
	}
	if h.Config.LazyServed && !b.Has(criu.KeepsUffds) {
		h.Config.LazyServed = false
		h.CRIUOff = append(h.CRIUOff, "--lazy-served: "+b.Lacks(criu.KeepsUffds))
		log.Warn("--lazy-served turned off: served lazy resumes need lazy-pages to keep every task's userfaultfd; lazy resumes rehash every byte first",
			"reason", b.Lacks(criu.KeepsUffds))
	}
}
