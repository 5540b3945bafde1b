package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/daemon"
	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/host"
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/metrics"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/platform"
	"github.com/runrecordd/runrecordd/internal/retention"
	"github.com/runrecordd/runrecordd/internal/server"
	"github.com/runrecordd/runrecordd/internal/warmpool"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"golang.org/x/sys/unix"
)

// serveFlags are serve's flags, as parsed.
type serveFlags struct {
	state, socket, ctrd, coeffs, sysfs, level string
	gcEvery, retention, criuDeadline          time.Duration
	minFree                                   uint64
	mounts                                    listFlag
	egressFlag                                listFlag
	egressAllow                               []netip.Prefix
	egressResolverFlag                        string
	egressResolver                            netip.AddrPort
	egressPool, egressPrefix                  string
	egressHold                                time.Duration
	egress                                    daemon.EgressLinks
	objMax, bundleMax, jsonMax                int64
	objectsMax                                int
	etcd                                      etcdFlags
	leaseTTL                                  time.Duration
	peerListen                                string
	chunkedImages                             bool
	lazyResume, lazyServed                    bool
	postCopy                                  bool
	postCopyWait                              time.Duration
	lazyResumeSet, lazyServedSet              bool // given on the command line or in the config
	userNS, hostRootImages                    bool
	warmPool                                  int
	warmAge                                   time.Duration
	onStop                                    string
	platform                                  platform.Limits
	platformMounts                            listFlag
	criuBuild                                 string
	metricsListen                             string
	logFormat                                 string
	configFile                                string
}

// register declares serve's flags on fs.
func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.configFile, configFlag, "", "read settings from this TOML file, keys named as these flags; flags given override it (default "+defaultConfigFile+" if it exists)")
	fs.StringVar(&f.state, "state-dir", host.DefaultStateDir, "state directory: store, host key, embedded containerd")
	fs.StringVar(&f.socket, "socket", "", "API socket (default STATE-DIR/runrecordd.sock)")
	fs.StringVar(&f.ctrd, "containerd-address", "", "use this containerd instead of starting an embedded one")
	fs.StringVar(&f.coeffs, "coefficients", "", "JSON file of energy coefficients over the defaults (docs/energy.md)")
	fs.StringVar(&f.sysfs, "sysfs", "", "sysfs root the meter reads RAPL zones under (default /sys)")
	fs.StringVar(&f.level, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "the log's format on standard error: text (key=value) or json (one object a line)")
	fs.DurationVar(&f.gcEvery, "gc-interval", retention.DefaultInterval, "how often to collect the store (negative: never)")
	fs.DurationVar(&f.retention, "snapshot-retention", retention.DefaultKeep, "how long a closed run keeps its image snapshots (negative: forever)")
	fs.Uint64Var(&f.minFree, "min-free", park.DefaultMinFree, "bytes an image park must leave free on the store's filesystem")
	fs.BoolVar(&f.chunkedImages, "chunked-images", true, "store image parks' memory pages as 16 KiB chunks by virtual address, so a later park stores only the chunks that changed; =false stores them whole (docs/chunked-images.md)")
	fs.DurationVar(&f.criuDeadline, "criu-deadline", 0, "deadline of every CRIU dump and restore (default 30s plus 1s per 64 MiB of the unit's memory; docs/daemon.md)")
	fs.Var(&f.mounts, "bundle-mount-allow", "a host path under which an imported bundle's read-only mounts may lie (repeat for more; default none: docs/trust.md)")
	fs.Var(&f.egressFlag, "egress-allow", "an IPv4 network (CIDR) an egress grant's destinations may lie in: the host's egress ceiling (repeat for more; default none: no run is granted egress; docs/unit.md)")
	fs.StringVar(&f.egressResolverFlag, "egress-resolver", "", "IPv4:PORT of the upstream DNS resolver the daemon asks for its runs' names: egress grants may then name destinations (needs --egress-allow; default none: a name is refused; docs/unit.md)")
	fs.StringVar(&f.egressPool, "egress-pool", egress.DefaultPool.String(), "with --egress-allow: the IPv4 network (a /16 to a /30) of the runs' addresses on this host, one per run's link (docs/daemon.md)")
	fs.StringVar(&f.egressPrefix, "egress-link-prefix", egress.DefaultLinkPrefix, "with --egress-allow: the name prefix of the runs' links on this host (1 to 10 of a-z), which names its nftables tables too; two daemons in one network namespace need pools and prefixes apart")
	fs.DurationVar(&f.egressHold, "egress-park-hold", daemon.DefaultParkHold, "with --egress-allow: how long a park keeps a run's connections to outside; a resume after it closes them (docs/unit.md)")
	fs.Int64Var(&f.objMax, "bundle-object-max", bundle.DefaultLimits.Object, "the largest object an imported bundle may carry, in bytes")
	fs.Int64Var(&f.bundleMax, "bundle-max", bundle.DefaultLimits.Total, "the most object bytes an imported bundle may carry")
	fs.Int64Var(&f.jsonMax, "bundle-json-max", bundle.DefaultLimits.JSON, "the largest JSON member (record.json) of an imported bundle, in bytes")
	fs.IntVar(&f.objectsMax, "bundle-objects-max", bundle.DefaultLimits.Objects, "the most objects an imported bundle may carry (each costs a staged file however small)")
	fs.BoolVar(&f.userNS, "user-namespaces", true, "run units in user namespaces: each run's ids 0-65535 mapped to a host range of its own (docs/trust.md); false runs every unit as the host's root and needs --allow-host-root-images")
	fs.BoolVar(&f.hostRootImages, "allow-host-root-images", false, "accept image units that run as the host's root: where a dump and restore in a user namespace fails here, for parks made without one, and with --user-namespaces=false (docs/trust.md)")
	fs.BoolVar(&f.lazyResume, "lazy-resume", true, "resume image parks lazily: the unit runs before its memory is all back; =false resumes eagerly. Off, logged, where CRIU cannot (criu check --feature uffd-noncoop, its patches); given as true there, the start is refused (docs/lazy-resume.md)")
	fs.BoolVar(&f.lazyServed, "lazy-served", true, "with --lazy-resume: a page server verifies each chunk of a chunked image as its pages are first served, instead of the resume rehashing every stored byte before the restore; =false rehashes (docs/lazy-resume.md)")
	fs.BoolVar(&f.postCopy, "post-copy", true, "in a fleet with --lazy-resume --lazy-served: take a run migrated here before the slabs of its last memory image, fetched after the answer, and resume one that was executing as they come (docs/fleet.md, \"Post-copy\")")
	fs.DurationVar(&f.postCopyWait, "post-copy-wait", maxPostCopyWait, "how long a stop, and a drain's end, wait for the post-copy targets fetching the slabs of runs migrated from here, at most 30s: the stop fits in the unit's TimeoutStopSec (docs/fleet.md, \"Post-copy\")")
	fs.IntVar(&f.warmPool, "warm-pool", warmpool.DefaultMax, "how many warm sandboxes to keep at once for parked transcript runs awaiting results (0: none; docs/warm-pool.md)")
	fs.StringVar(&f.criuBuild, "criu-build", criu.BuildFile, "the manifest of the CRIU build deploy/setup.sh installed: a fast path whose patch the build lacks is turned off (docs/setup.md)")
	fs.DurationVar(&f.warmAge, "warm-pool-age", warmpool.DefaultMaxAge, "how long a warm sandbox waits for its run's resume before it is discarded")
	fs.StringVar(&f.onStop, "on-stop", "", "what a stop (SIGTERM) does with executing runs: park (the next start resumes them) or leave (running in their shims; the next start reattaches); default park (docs/daemon.md)")
	f.etcd.register(fs)
	fs.DurationVar(&f.leaseTTL, "lease-ttl", fleet.DefaultTTL, "in a fleet: the time to live of this host's lease, which its ownership of runs rides on")
	fs.IntVar(&f.platform.Runs, "platform-runs", platform.DefaultRuns, "in a fleet: how many runs each platform key may have on this host at once (not closed, not handed off)")
	fs.Int64Var(&f.platform.StoreBytes, "platform-store-bytes", platform.DefaultStoreBytes, "in a fleet: how many bytes of this host's store each platform key's runs may reach before it may start no more")
	fs.Var(&f.platformMounts, "platform-mount-allow", "in a fleet: a host path under which a platform key's runs may mount read-only (repeat for more; default none: docs/fleet.md)")
	fs.StringVar(&f.metricsListen, "metrics-listen", "", "serve /metrics alone, over plain HTTP, on this host:port for a Prometheus scraper (no run ids in labels; default: /metrics only on the API socket)")
	fs.StringVar(&f.peerListen, "peer-listen", "", "in a fleet: serve the fleet on this host:port over mutual TLS (the API to admitted platform keys, runs and objects to admitted hosts); other hosts reach this host there, so give an address they can")
}

// applyConfigFile applies --config's file, or the default one if it
// exists, to the flags the command line did not set.
func (f *serveFlags) applyConfigFile(fs *flag.FlagSet) error {
	if f.configFile != "" {
		return applyConfigFile(fs, f.configFile, true)
	}
	return applyConfigFile(fs, defaultConfigFile, false)
}

// given notes which of the flags whose defaults depend on the host were
// given, on the command line or in the config (after applyConfigFile).
func (f *serveFlags) given(fs *flag.FlagSet) {
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "lazy-resume":
			f.lazyResumeSet = true
		case "lazy-served":
			f.lazyServedSet = true
		}
	})
}

// check refuses, as usage errors, the flag values the daemon cannot run
// with, before anything on the host is touched, and returns the log level.
func (f *serveFlags) check() (slog.Level, error) {
	var lv slog.Level
	if f.objMax <= 0 || f.bundleMax <= 0 || f.jsonMax <= 0 || f.objectsMax <= 0 {
		return lv, usagef("--bundle-object-max, --bundle-max, --bundle-json-max and --bundle-objects-max must be positive")
	}
	for _, m := range f.mounts {
		if !filepath.IsAbs(m) {
			return lv, usagef("--bundle-mount-allow %s: not an absolute path", m)
		}
	}
	f.egressAllow = nil
	for _, c := range f.egressFlag {
		p, err := netip.ParsePrefix(c)
		if err != nil || !p.Addr().Is4() || p.Masked() != p {
			return lv, usagef("--egress-allow %s: want an IPv4 network, as 192.0.2.0/24", c)
		}
		f.egressAllow = append(f.egressAllow, p)
	}
	f.egressResolver = netip.AddrPort{}
	if f.egressResolverFlag != "" {
		ap, err := netip.ParseAddrPort(f.egressResolverFlag)
		if err != nil || !ap.Addr().Is4() || ap.Port() == 0 {
			return lv, usagef("--egress-resolver %s: want an IPv4 address and port, as 192.0.2.53:53", f.egressResolverFlag)
		}
		if len(f.egressAllow) == 0 {
			return lv, usagef("--egress-resolver needs --egress-allow: a name's addresses are held to the egress ceiling")
		}
		f.egressResolver = ap
	}
	pool, err := netip.ParsePrefix(f.egressPool)
	if err != nil || !pool.Addr().Is4() || pool.Masked() != pool || pool.Bits() < 16 || pool.Bits() > 30 {
		return lv, usagef("--egress-pool %s: want an IPv4 network from /16 to /30, as 10.254.0.0/16", f.egressPool)
	}
	if n := len(f.egressPrefix); n < 1 || n > 10 || strings.Trim(f.egressPrefix, "abcdefghijklmnopqrstuvwxyz") != "" {
		return lv, usagef("--egress-link-prefix %q: want 1 to 10 of a-z", f.egressPrefix)
	}
	if f.egressHold < time.Second {
		return lv, usagef("--egress-park-hold must be at least 1s")
	}
	f.egress = daemon.EgressLinks{Pool: pool, LinkPrefix: f.egressPrefix, ParkHold: f.egressHold}
	for _, m := range f.platformMounts {
		if !filepath.IsAbs(m) {
			return lv, usagef("--platform-mount-allow %s: not an absolute path", m)
		}
	}
	f.platform.Mounts = f.platformMounts
	f.platform.EgressAllow, f.platform.EgressNames = f.egressAllow, f.egressResolver.IsValid()
	if f.platform.Runs <= 0 || f.platform.StoreBytes <= 0 {
		return lv, usagef("--platform-runs and --platform-store-bytes must be positive")
	}
	if err := lv.UnmarshalText([]byte(f.level)); err != nil {
		return lv, usagef("--log-level: %v", err)
	}
	if f.logFormat != "text" && f.logFormat != "json" {
		return lv, usagef("--log-format %s: want text or json", f.logFormat)
	}
	if f.criuDeadline < 0 {
		return lv, usagef("--criu-deadline must not be negative")
	}
	if !f.userNS && !f.hostRootImages {
		return lv, usagef("--user-namespaces=false runs every unit as the host's root: say so with --allow-host-root-images too")
	}
	if f.minFree == 0 {
		return lv, usagef("--min-free must be at least 1 byte")
	}
	if f.peerListen != "" && f.etcd.endpoints == "" {
		return lv, usagef("--peer-listen needs --etcd: the fleet's directory says which keys are admitted")
	}
	if f.postCopyWait < 0 || f.postCopyWait > maxPostCopyWait {
		return lv, usagef("--post-copy-wait must be between 0 and %s: a stop's waits fit in the unit's TimeoutStopSec", maxPostCopyWait)
	}
	if f.warmPool < 0 || f.warmAge <= 0 {
		return lv, usagef("--warm-pool must not be negative, and --warm-pool-age must be positive")
	}
	if f.lazyServed && !f.lazyResume {
		if f.lazyServedSet {
			return lv, usagef("--lazy-served needs --lazy-resume")
		}
		f.lazyServed = false // its default goes with --lazy-resume=false
	}
	if f.leaseTTL <= 0 {
		return lv, usagef("--lease-ttl must be positive")
	}
	if f.onStop != "" && f.onStop != onStopPark && f.onStop != onStopLeave {
		return lv, usagef("--on-stop %s: want park or leave", f.onStop)
	}
	if f.gcEvery == 0 || f.retention == 0 {
		return lv, usagef("--gc-interval and --snapshot-retention must not be zero (negative: never)")
	}
	return lv, nil
}

// config is the daemon's config from the checked flags, with the
// coefficients file, if one is named, read and parsed.
func (f *serveFlags) config(log *slog.Logger) (daemon.Config, error) {
	cfg := daemon.Config{Config: host.Config{StateDir: f.state, ContainerdAddress: f.ctrd, Logger: log, ChunkedImages: f.chunkedImages,
		LazyResume: f.lazyResume, LazyGiven: f.lazyResume && f.lazyResumeSet, LazyServed: f.lazyServed, WarmPool: f.warmPool, WarmMaxAge: f.warmAge, CRIUBuild: f.criuBuild,
		UserNS: f.userNS, HostRootImages: f.hostRootImages},
		ParkLimits:  forms.ParkLimits{CRIUDeadline: f.criuDeadline, MinFree: f.minFree},
		Policy:      retention.Policy{GCInterval: f.gcEvery, SnapshotRetention: f.retention},
		Intake:      bundle.Intake{BundleLimits: bundle.Limits{Object: f.objMax, Total: f.bundleMax, JSON: f.jsonMax, Objects: f.objectsMax}, BundleMounts: f.mounts},
		EgressAllow: f.egressAllow, EgressResolver: f.egressResolver, Egress: f.egress}
	cfg.Meter.SysfsRoot = f.sysfs
	if f.coeffs != "" {
		b, err := os.ReadFile(f.coeffs)
		if err != nil {
			return cfg, err
		}
		if cfg.Meter.Coefficients, err = idle.ParseCoefficients(b); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

func cmdServe(args []string, stdout io.Writer) error {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("serve takes no arguments")
	}
	if err := f.applyConfigFile(fs); err != nil {
		return err
	}
	f.given(fs)
	lv, err := f.check()
	if err != nil {
		return err
	}
	// Read (and hidden from containerd and the units) before anything
	// starts.
	sd := notifierFromEnv()
	log := newLogger(os.Stderr, f.logFormat, lv)
	f.etcd.log = log
	cfg, err := f.config(log)
	if err != nil {
		return err
	}
	socket := f.socket
	if socket == "" {
		socket = filepath.Join(f.state, "runrecordd.sock")
	}
	// Descriptors this process inherited (a lock its caller holds, a
	// pipe of a supervisor) must not reach containerd, CRIU or a unit:
	// CRIU refuses to dump a process holding a file lock.
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err != nil {
		log.Warn("could not mark inherited descriptors close-on-exec", "err", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Listen first: a second daemon on the same socket fails here, before
	// it touches containerd or the store.
	l, err := server.Listen(socket)
	if err != nil {
		return err
	}
	defer os.Remove(socket)
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	dir, leave, err := f.joinFleet(startCtx, &cfg)
	if err != nil {
		cancel()
		l.Close()
		return err
	}
	defer leave()
	d, err := daemon.New(startCtx, cfg)
	cancel()
	if err != nil {
		l.Close()
		return err
	}
	var peers *http.Server
	if f.peerListen != "" {
		var pl net.Listener
		books, err := platform.Open(platform.Dir(f.state))
		if err == nil {
			platforms := server.NewPlatform(serverDeps(d), server.Tenancy{Books: books, Limits: f.platform}, log)
			peers, pl, err = peerServer(f.state, f.peerListen, dir, peerHandlers{platform: platforms, host: server.Peer(serverDeps(d), log)}, log)
		}
		if err != nil {
			l.Close()
			return errors.Join(err, d.Shutdown(context.Background()))
		}
		cutRevoked(ctx, dir, peers, log)
		go func() { _ = peers.Serve(pl) }()
		log.Info("serving the fleet's platforms", "peer-listen", pl.Addr().String())
	}
	svc := &service{d: d, notify: sd, onStop: onStopPolicy(f.onStop), socket: socket, log: log, postCopyWait: f.postCopyWait, holds: d.Rooms().Fleet.WaitHolds}
	if f.metricsListen != "" {
		if svc.metrics, err = serveMetrics(f.metricsListen, d, log); err != nil {
			l.Close()
			return errors.Join(err, d.Shutdown(context.Background()))
		}
	}
	return serveAPI(ctx, svc, l, stdout, peers)
}

// serveAPI serves the daemon's API on l until ctx is done (SIGTERM,
// SIGINT) or the HTTP server fails, then shuts down the server, applies
// the stop policy and waits for the post-copy holds (service.stopServing),
// and shuts down the daemon, each within its bound (apiStopBound…), and
// returns what failed.
//
// peers, when not nil, is the API on the fleet's mutual-TLS listener,
// already serving: it serves on through the parks and the holds' wait,
// and is shut down before the daemon.
func serveAPI(ctx context.Context, svc *service, l net.Listener, stdout io.Writer, peers *http.Server) error {
	d, socket, log := svc.d, svc.socket, svc.log
	srv := &http.Server{Handler: server.New(serverDeps(d), log), ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(d.Rooms().Events.Stop) // event streams never end by themselves
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	log.Info("serving", "socket", socket, "state", d.Host().StateDir)
	fmt.Fprintf(stdout, "runrecordd serving on %s\n", socket)
	// The runs the last stop parked come back, then systemd hears READY=1.
	stopPings := svc.started(ctx)
	defer stopPings()
	var err error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "on-stop", svc.onStop)
	case err = <-errc:
	}
	svc.beginStop()
	sctx, cancel := context.WithTimeout(context.Background(), apiStopBound)
	defer cancel()
	serr := srv.Shutdown(sctx)
	var peer shutdowner
	if peers != nil {
		peer = peers
	}
	serr = errors.Join(serr, svc.stopServing(peer))
	if svc.metrics != nil {
		serr = errors.Join(serr, svc.metrics.Close())
	}
	dctx, dcancel := context.WithTimeout(context.Background(), daemonStopBound)
	defer dcancel()
	derr := d.Shutdown(dctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, serr, derr)
}

// joinFleet joins the fleet with --etcd, before the daemon opens anything,
// and sets cfg's session, its rejoin, and with --peer-listen its peers;
// without --etcd it does nothing. The returned function leaves the fleet.
func (f *serveFlags) joinFleet(ctx context.Context, cfg *daemon.Config) (*fleet.Dir, func(), error) {
	if f.etcd.endpoints == "" {
		return nil, func() {}, nil
	}
	dir, host, leave, err := joinFleet(ctx, f.etcd, f.state, f.leaseTTL, f.peerListen)
	if err != nil {
		return nil, nil, err
	}
	cfg.Fleet = host
	ttl, peerAddr := f.leaseTTL, f.peerListen
	cfg.Rejoin = func(ctx context.Context) (*fleet.Session, error) { return dir.JoinAt(ctx, host.Key(), ttl, peerAddr) }
	if f.peerListen != "" {
		key, err := attest.LoadOrCreateKey(filepath.Join(f.state, "host.key"))
		if err != nil {
			leave()
			return nil, nil, err
		}
		reuse := peer.NewReuse()
		cfg.Peers = peers{peer.Hosts{Dir: dir, Key: key, Reuse: reuse}}
		cfg.PostCopy, cfg.PostCopyWait = f.postCopy && f.lazyResume && f.lazyServed, f.postCopyWait
		left := leave
		leave = func() { reuse.Close(); left() }
	}
	return dir, leave, nil
}

// serverDeps are what internal/server answers from: the daemon, and the
// rooms it wired.
func serverDeps(d *daemon.Daemon) server.Deps {
	r := d.Rooms()
	return server.Deps{Daemon: d, Store: r.Store, Keys: r.Keys, Collector: r.Collector, Events: r.Events,
		Counts: r.Counts, Fleet: r.Fleet, Placement: r.Placement, Metrics: r.Metrics, Objects: r.Objects, Exporter: r.Exporter}
}

// serveMetrics serves d's /metrics, and nothing else, over plain HTTP on
// addr, until the returned server is closed.
func serveMetrics(addr string, d *daemon.Daemon, log *slog.Logger) (*http.Server, error) {
	ml, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	ms := &http.Server{Handler: metrics.Listener(d.Rooms().Scrape), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = ms.Serve(ml) }()
	log.Info("serving metrics", "metrics-listen", ml.Addr().String())
	return ms, nil
}

// newLogger is the daemon's log on w: format text or json (checked), from
// level up.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
