package host

import (
	"log/slog"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// identifyCRIU finds the CRIU build the executor runs (its build record
// and what it can do: internal/criu) and turns off each fast path it
// cannot take ([fastPaths]), saying why in the log. A CRIU that did not
// answer at start is not looked at: no image parks here at all.
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
			"criu", b.Binary, "why", b.Unknown, "patches", b.Patches(), "can", b.Capabilities())
	} else {
		log.Info("CRIU build", "criu", b.Binary, "version", b.Record.Version, "patches", b.Patches(), "can", b.Capabilities())
	}
	h.CRIUOff = fastPaths(&h.Config, b, log)
}

// capable is what [fastPaths] asks of a CRIU build (criu.Build).
type capable interface {
	Has(criu.Capability) bool
	Lacks(criu.Capability) string
}

// fastPaths turns off in cfg each fast path that b cannot take, logs it
// and returns one line for each, "FLAG: why":
//
//   - --lazy-resume where units run in user namespaces: CRIU opens each
//     restored task's userfaultfd inside the unit's user namespace, which
//     the kernel refuses without deploy/criu/5-lazy-pages-userns-uffd.patch
//     (vm.unprivileged_userfaultfd=0, its default); --lazy-served goes
//     with it, and says so;
//   - --lazy-resume: each restored task must keep its own userfaultfd
//     (deploy/criu/8-restored-tasks-keep-uffds.patch), or a unit whose
//     lazy-pages and daemon both die runs on zero-filled pages;
//     --lazy-served goes with it;
//   - --lazy-served: lazy-pages must keep every task's userfaultfd until
//     every page is in (deploy/criu/2-lazy-pages-keep-uffds.patch).
//
// The daemon runs the build all the same: image parks and eager resumes
// need no patch.
func fastPaths(cfg *Config, b capable, log *slog.Logger) []string {
	var off []string
	served := cfg.LazyServed
	if cfg.LazyResume && cfg.UserNS && !b.Has(criu.UsernsUffd) {
		cfg.LazyResume, cfg.LazyServed = false, false
		why := b.Lacks(criu.UsernsUffd)
		off = append(off, "--lazy-resume: "+why)
		log.Warn("--lazy-resume turned off: units run in user namespaces, where a lazy restore needs a userfaultfd CRIU cannot open there; resumes are eager",
			"reason", why)
	}
	switch {
	case served && !b.Has(criu.KeepsUffds):
		cfg.LazyServed = false
		why := b.Lacks(criu.KeepsUffds)
		off = append(off, "--lazy-served: "+why)
		log.Warn("--lazy-served turned off: served lazy resumes need lazy-pages to keep every task's userfaultfd; lazy resumes rehash every byte first",
			"reason", why)
	case served && !cfg.LazyServed:
		off = append(off, "--lazy-served: off with --lazy-resume")
		log.Warn("--lazy-served turned off with --lazy-resume")
	}
	if cfg.LazyResume && !b.Has(criu.TasksKeepUffds) {
		cfg.LazyResume = false
		why := b.Lacks(criu.TasksKeepUffds)
		off = append(off, "--lazy-resume: "+why)
		log.Warn("--lazy-resume turned off: the restored tasks would not keep their own userfaultfds, and a unit whose lazy-pages and daemon both died would run on zero-filled pages; resumes are eager",
			"reason", why)
		if cfg.LazyServed {
			cfg.LazyServed = false
			off = append(off, "--lazy-served: off with --lazy-resume")
			log.Warn("--lazy-served turned off with --lazy-resume")
		}
	}
	return off
}
