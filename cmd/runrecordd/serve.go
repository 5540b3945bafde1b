package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/pkg/bundle"
	"github.com/runrecordd/runrecordd/pkg/daemon"
	"github.com/runrecordd/runrecordd/pkg/idle"
	"github.com/runrecordd/runrecordd/pkg/server"
	"golang.org/x/sys/unix"
)

func cmdServe(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	state := fs.String("state-dir", daemon.DefaultStateDir, "state directory: store, host key, embedded containerd")
	socket := fs.String("socket", "", "API socket (default STATE-DIR/runrecordd.sock)")
	ctrd := fs.String("containerd-address", "", "use this containerd instead of starting an embedded one")
	coeffs := fs.String("coefficients", "", "JSON file of energy coefficients over the defaults (docs/energy.md)")
	sysfs := fs.String("sysfs", "", "sysfs root the meter reads RAPL zones under (default /sys)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	gcEvery := fs.Duration("gc-interval", daemon.DefaultGCInterval, "how often to collect the store (negative: never)")
	retention := fs.Duration("snapshot-retention", daemon.DefaultSnapshotRetention, "how long a closed run keeps its image snapshots (negative: forever)")
	minFree := fs.Uint64("min-free", daemon.DefaultMinFree, "bytes an image park must leave free on the store's filesystem")
	criuDeadline := fs.Duration("criu-deadline", 0, "deadline of every CRIU dump and restore (default 30s plus 1s per 64 MiB of the unit's memory; docs/daemon.md)")
	var mounts listFlag
	fs.Var(&mounts, "bundle-mount-allow", "a host path under which an imported bundle's read-only mounts may lie (repeat for more; default none: docs/trust.md)")
	objMax := fs.Int64("bundle-object-max", bundle.DefaultLimits.Object, "the largest object an imported bundle may carry, in bytes")
	bundleMax := fs.Int64("bundle-max", bundle.DefaultLimits.Total, "the most object bytes an imported bundle may carry")
	jsonMax := fs.Int64("bundle-json-max", bundle.DefaultLimits.JSON, "the largest JSON member (record.json) of an imported bundle, in bytes")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("serve takes no arguments")
	}
	if *objMax <= 0 || *bundleMax <= 0 || *jsonMax <= 0 {
		return usagef("--bundle-object-max, --bundle-max and --bundle-json-max must be positive")
	}
	for _, m := range mounts {
		if !filepath.IsAbs(m) {
			return usagef("--bundle-mount-allow %s: not an absolute path", m)
		}
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return usagef("--log-level: %v", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	if *criuDeadline < 0 {
		return usagef("--criu-deadline must not be negative")
	}
	if *minFree == 0 {
		return usagef("--min-free must be at least 1 byte")
	}
	if *gcEvery == 0 || *retention == 0 {
		return usagef("--gc-interval and --snapshot-retention must not be zero (negative: never)")
	}
	cfg := daemon.Config{StateDir: *state, ContainerdAddress: *ctrd, Logger: log, CRIUDeadline: *criuDeadline,
		GCInterval: *gcEvery, SnapshotRetention: *retention, MinFree: *minFree,
		BundleLimits: bundle.Limits{Object: *objMax, Total: *bundleMax, JSON: *jsonMax}, BundleMounts: mounts}
	cfg.Meter.SysfsRoot = *sysfs
	if *coeffs != "" {
		b, err := os.ReadFile(*coeffs)
		if err != nil {
			return err
		}
		if cfg.Meter.Coefficients, err = idle.ParseCoefficients(b); err != nil {
			return err
		}
	}
	if *socket == "" {
		*socket = filepath.Join(*state, "runrecordd.sock")
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
	l, err := server.Listen(*socket)
	if err != nil {
		return err
	}
	defer os.Remove(*socket)
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	d, err := daemon.New(startCtx, cfg)
	cancel()
	if err != nil {
		l.Close()
		return err
	}
	srv := &http.Server{Handler: server.New(d, log), ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(d.StopEvents) // event streams never end by themselves
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	log.Info("serving", "socket", *socket, "state", d.StateDir())
	fmt.Fprintf(stdout, "runrecordd serving on %s\n", *socket)
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	serr := srv.Shutdown(sctx)
	dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer dcancel()
	derr := d.Shutdown(dctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, serr, derr)
}
