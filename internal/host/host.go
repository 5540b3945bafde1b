// Package host is what a runrecordd host stands on, opened from its state
// directory in order and closed in reverse (docs/daemon.md, "State
// directory"): the host key and its audit chain, the record store,
// containerd — an embedded one started and supervised under the state
// directory, or an existing one — and the executor connected to it, the
// energy meter, and the host's facts as its environment manifests record
// them. The daemon stands on one; it never imports the daemon.
//
// # State directory
//
//	DIR/
//	  store/            the record store and its objects (internal/store)
//	  containerd/       the embedded containerd, when no address is given
//	  host.key          the host's ed25519 key (pkg/attest)
//	  audit-head        the host's last attestation: the next one's audit_prev
//	  comeback.json     the runs a stop parked, for the next start (internal/daemon)
//	  runs/<id>/        a run's unit output on this host (stdout, stderr)
//	  ch/<id>/, spool/<id>  a transcript run's channel and journal spool (internal/calls)
//	  restore/<id>/     trees a restore reads, linked from the store, removed after
//	  platform/<id>     the platform key that started the run (internal/platform)
//	  idmap/N           a user-namespace range held, and its holder (internal/idmap)
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/warmpool"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// DefaultStateDir is where a host keeps its state unless told otherwise.
const DefaultStateDir = "/var/lib/runrecordd"

// Config says where a host's state is and what it runs on.
type Config struct {
	// StateDir holds everything the host keeps; DefaultStateDir when
	// empty.
	StateDir string
	// ContainerdAddress is an existing containerd's socket; empty starts
	// and supervises a private one under StateDir/containerd.
	ContainerdAddress string
	// Namespace is the containerd namespace (executor.DefaultNamespace
	// when empty).
	Namespace string
	// Meter configures energy metering (sysfs, procfs and cgroup roots;
	// coefficients).
	Meter idle.Config
	// CPUInfo is /proc/cpuinfo, for the environment manifest.
	CPUInfo string
	// Logger receives the host's events; slog.Default() when nil.
	Logger *slog.Logger
	// ChunkedImages stores image parks' memory pages in the chunked form
	// (serve --chunked-images; store.Store.SetChunkedImages).
	ChunkedImages bool
	// LazyResume restores image parks lazily: the unit runs before its
	// memory is all back (docs/lazy-resume.md; serve --lazy-resume, on
	// by default). Where the CRIU cannot (criu check --feature
	// uffd-noncoop, or no CRIU at all) it is turned off and logged, or,
	// with LazyGiven, the host refuses to open.
	LazyResume bool
	// LazyGiven says LazyResume was asked for (given on serve's command
	// line or in its config), not taken by default.
	LazyGiven bool
	// LazyServed, with LazyResume, verifies each lazily served chunk of a
	// chunked image as its pages are first served (internal/criu/pageserver)
	// instead of every stored byte before the restore (docs/lazy-resume.md,
	// "The page server").
	LazyServed bool
	// WarmPool is how many warm sandboxes the host keeps at once for
	// parked transcript runs (internal/warmpool; serve --warm-pool
	// defaults to warmpool.DefaultMax); 0 keeps none. WarmMaxAge is how
	// long one waits (warmpool.DefaultMaxAge when 0).
	WarmPool   int
	WarmMaxAge time.Duration
	// CRIUBuild is the manifest of the CRIU build deploy/setup.sh
	// installed (criu.BuildFile when empty; internal/criu).
	CRIUBuild string
	// UserNS runs units in a user namespace of their own, each run's
	// ids 0..65535 mapped to a host range of its own (Ranges; serve
	// --user-namespaces, on by default), image units where the probe
	// dumped and restored in one (docs/trust.md).
	UserNS bool
	// HostRootImages accepts image units that run as the host's root
	// (serve --allow-host-root-images): without UserNS, where the
	// probe's dump and restore in a user namespace failed, and a park
	// made without one.
	HostRootImages bool
}

// Host is a host's state directory and runtime, open.
type Host struct {
	// Config is the configuration it was opened with, its defaults filled
	// in and StateDir absolute.
	Config     Config
	Signer     *interval.Signer     // the host key and its audit chain
	Store      *store.Store         // STATE/store
	Containerd *executor.Containerd // the embedded one; nil with an existing one
	Exec       *executor.Client
	Meter      *idle.Meter
	// Facts are the host's own facts and runtime versions, for its
	// environment manifests.
	Facts manifest.Manifest
	// Ranges are the host's user-namespace ranges (STATE/idmap), each
	// held by one run.
	Ranges *idmap.Ranges
	// CRIUErr is why CRIU did not answer, if it did not: no image parks
	// here, but transcript runs.
	CRIUErr error
	// CRIU is the CRIU build the executor runs, as far as it is known,
	// and what it can do; fast paths it cannot take are off in Config.
	CRIU criu.Build
	// CRIUOff names each fast path turned off for want of a patch, and
	// why.
	CRIUOff []string
	// Warm is the host's warm sandboxes (internal/warmpool), opened last
	// and closed first: its sandboxes are discarded at shutdown.
	Warm *warmpool.Pool
}

// Open opens the host's state directory and runtime, in order: the host
// key and its audit chain, the store, containerd and the executor, the
// meter, the facts. Refused at any step, it closes what it opened.
func Open(ctx context.Context, cfg Config) (_ *Host, err error) {
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.CPUInfo == "" {
		cfg.CPUInfo = "/proc/cpuinfo"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StateDir, err = filepath.Abs(cfg.StateDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("daemon: state directory: %w", err)
	}
	h := &Host{Config: cfg}
	defer func() {
		if err != nil {
			_ = h.Close(context.WithoutCancel(ctx))
		}
	}()
	if err := h.openState(); err != nil {
		return nil, err
	}
	if err := h.connect(ctx); err != nil {
		return nil, err
	}
	if h.Meter, err = idle.NewMeter(cfg.Meter); err != nil {
		return nil, fmt.Errorf("daemon: meter: %w", err)
	}
	if err := h.readFacts(ctx); err != nil {
		return nil, err
	}
	h.identifyCRIU()
	if err := h.checkLazy(ctx); err != nil {
		return nil, err
	}
	h.openWarm()
	return h, nil
}

// openWarm removes what a killed daemon's warm sandboxes left of their
// channels (their containers go at the reconcile) and starts the pool.
func (h *Host) openWarm() {
	cfg := h.Config
	warmpool.RemoveLeftovers(filepath.Join(cfg.StateDir, "ch"), func(run string) (bool, error) {
		r, err := h.Store.Run(run)
		if errors.Is(err, store.ErrNoRun) {
			return false, nil
		}
		return err == nil && r.Phase == record.PhaseExecuting, err
	}, cfg.Logger)
	h.Warm = warmpool.New(warmpool.Config{Max: cfg.WarmPool, MaxAge: cfg.WarmMaxAge, Meter: h.Meter, Log: cfg.Logger})
}

// openState opens what the state directory keeps: the host key and its
// audit chain, and the store.
func (h *Host) openState() error {
	dir := h.Config.StateDir
	key, err := attest.LoadOrCreateKey(filepath.Join(dir, "host.key"))
	if err != nil {
		return fmt.Errorf("daemon: host key: %w", err)
	}
	if h.Signer, err = interval.NewSigner(key, filepath.Join(dir, "audit-head")); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	if h.Store, err = store.Open(filepath.Join(dir, "store")); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	h.Store.SetChunkedImages(h.Config.ChunkedImages)
	if h.Ranges, err = idmap.Open(filepath.Join(dir, "idmap"), idmap.Config{}); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	if h.Config.UserNS {
		// runc sets up a user-namespaced sandbox's rootfs as its
		// range's root, through the state directory.
		if err := reachable(dir); err != nil {
			return fmt.Errorf("daemon: user namespaces: %w", err)
		}
		if err := executor.Searchable(dir); err != nil {
			return fmt.Errorf("daemon: state directory: %w", err)
		}
	}
	// The call state of a daemon before the call ledger (results/RUN
	// files, and the calls and awaits in parked runs' journals) goes into
	// the ledger, once: internal/calls.
	if err := calls.Upgrade(h.Store, filepath.Join(dir, "results")); err != nil {
		h.Config.Logger.Warn("call ledger: not everything of the last daemon's calls was brought in; the next start retries", "err", err)
	}
	return nil
}

// connect starts the embedded containerd (without an address) and
// connects the executor to it.
func (h *Host) connect(ctx context.Context) error {
	cfg := h.Config
	var ecfg executor.Config
	if cfg.ContainerdAddress == "" {
		var err error
		if h.Containerd, err = executor.StartContainerd(ctx, filepath.Join(cfg.StateDir, "containerd"), cfg.Logger); err != nil {
			return fmt.Errorf("daemon: embedded containerd: %w", err)
		}
		ecfg = h.Containerd.Config()
	} else {
		ecfg = executor.Config{Address: cfg.ContainerdAddress, StateDir: filepath.Join(cfg.StateDir, "executor")}
	}
	ecfg.Namespace, ecfg.Logger = cfg.Namespace, cfg.Logger
	// No grant may mount the state directory (keys, store, records), nor
	// a system containerd's root (every unit's root filesystem, when the
	// daemon uses an external containerd: docs/trust.md).
	ecfg.Protected = []string{cfg.StateDir, "/var/lib/containerd"}
	if cfg.UserNS {
		// The probe dumps and restores in a user namespace of a range
		// of its own, held as long as the host runs them.
		r, err := h.Ranges.Take(executor.ProbeHolder)
		if err != nil {
			return fmt.Errorf("daemon: the probe's user-namespace range: %w", err)
		}
		ecfg.ProbeUserNS = &r
	}
	var err error
	if h.Exec, err = executor.Connect(ctx, ecfg); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	return nil
}

// readFacts reads the host's own facts and runtime versions for its
// environment manifests, and whether CRIU answered.
func (h *Host) readFacts(ctx context.Context) error {
	v, err := h.Exec.Versions(ctx)
	if err != nil {
		return fmt.Errorf("daemon: runtime versions: %w", err)
	}
	if v.CRIUErr != nil {
		v.CRIU = "unavailable"
	}
	h.Facts, err = manifest.Host(h.Config.CPUInfo, manifest.Manifest{
		manifest.CRIUVersion:       v.CRIU,
		manifest.RuncVersion:       v.Runc,
		manifest.ContainerdVersion: v.Containerd,
	})
	if err != nil {
		return fmt.Errorf("daemon: host facts: %w", err)
	}
	h.CRIUErr = v.CRIUErr
	return nil
}

// Close closes what Open opened, in reverse. Sandboxes keep running (a
// restarted daemon reattaches to them), and so do the embedded containerd's
// shims; the embedded containerd itself is stopped.
func (h *Host) Close(ctx context.Context) error {
	var errs []error
	h.Warm.Close(ctx)
	if h.Exec != nil {
		// A probe the stop cut short, or one an earlier process was
		// killed in, leaves nothing running.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		h.Exec.SweepProbes(sctx)
		cancel()
		errs = append(errs, h.Exec.Close())
	}
	if h.Containerd != nil {
		errs = append(errs, h.Containerd.Stop(ctx), h.Containerd.RemoveCgroups())
	}
	if h.Store != nil {
		errs = append(errs, h.Store.Close())
	}
	return errors.Join(errs...)
}

// Info describes the host, with the state of its image parks (parks).
func (h *Host) Info(parks imageparks.Status) answers.HostInfo {
	out := answers.HostInfo{KeyID: h.Signer.KeyID(), StateDir: h.Config.StateDir, Embedded: h.Containerd != nil,
		Containerd: h.Config.ContainerdAddress, Manifest: manifest.Manifest{}, Meter: h.Meter.Snapshot(), ImageParks: parks,
		CRIU: h.CRIU, CRIUOff: h.CRIUOff, UserNS: h.Config.UserNS, HostRootImages: h.Config.HostRootImages}
	if h.Containerd != nil {
		out.Containerd = h.Containerd.Address()
	}
	for k, v := range h.Facts {
		out.Manifest[k] = v
	}
	return out
}

// reachable refuses a state directory that an unprivileged user cannot
// reach: a directory above it that others may not search (runc sets up a
// user-namespaced sandbox's rootfs, under the state directory, as its
// range's root).
func reachable(dir string) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s (mode %v) above the state directory %s is not searchable by others: a sandbox's runc, as its range's root, cannot reach its rootfs", d, fi.Mode().Perm(), dir)
		}
		if d == "/" {
			return nil
		}
	}
}
