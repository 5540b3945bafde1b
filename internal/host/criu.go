package host

import (
	"context"
	"fmt"
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
		cfg.LazyResume = false // --lazy-served goes with it below
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
	case served && !cfg.LazyResume:
		off = append(off, servedOff(cfg, log)...)
	}
	if cfg.LazyResume && !b.Has(criu.TasksKeepUffds) {
		cfg.LazyResume = false
		why := b.Lacks(criu.TasksKeepUffds)
		off = append(off, "--lazy-resume: "+why)
		log.Warn("--lazy-resume turned off: the restored tasks would not keep their own userfaultfds, and a unit whose lazy-pages and daemon both died would run on zero-filled pages; resumes are eager",
			"reason", why)
		off = append(off, servedOff(cfg, log)...)
	}
	return off
}

// servedOff turns --lazy-served off in cfg with --lazy-resume, logs it and
// returns its line, as [fastPaths] does; nothing if it was off.
func servedOff(cfg *Config, log *slog.Logger) []string {
	if !cfg.LazyServed {
		return nil
	}
	cfg.LazyServed = false
	log.Warn("--lazy-served turned off with --lazy-resume")
	return []string{"--lazy-served: off with --lazy-resume"}
}

// checkLazy asks the CRIU the executor runs whether it can restore
// lazily at all, when the config still asks for it ([lazyOff]).
func (h *Host) checkLazy(ctx context.Context) error {
	if !h.Config.LazyResume {
		return nil
	}
	why, err := "no CRIU answered at start", h.CRIUErr
	if err == nil {
		why, err = "criu check --feature uffd-noncoop fails", criu.CheckLazy(ctx, h.Exec.Config().CRIU)
	}
	if err == nil {
		return nil
	}
	if h.Config.LazyGiven {
		return fmt.Errorf("daemon: lazy resume: %w", err)
	}
	h.CRIUOff = append(h.CRIUOff, lazyOff(&h.Config, why, err, h.Config.Logger)...)
	return nil
}

// lazyOff turns off, at its default, a lazy resume the CRIU cannot do
// (why, err), and --lazy-served with it, logs it and returns the lines
// for each as [fastPaths] does. (Given, --lazy-resume refuses the
// start instead: checkLazy.)
func lazyOff(cfg *Config, why string, err error, log *slog.Logger) []string {
	log.Warn("--lazy-resume turned off: this host's CRIU cannot restore lazily; resumes are eager", "reason", err)
	cfg.LazyResume = false
	return append([]string{"--lazy-resume: " + why}, servedOff(cfg, log)...)
}
