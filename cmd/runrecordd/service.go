package main

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/internal/daemon"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
)

// The stop policies (serve --on-stop; docs/daemon.md, "Stop and start").
const (
	// onStopPark parks every executing run before the daemon exits; the
	// next start resumes them. The default.
	onStopPark = "park"
	// onStopLeave leaves the units running in their shims; the next
	// start reattaches to them: for a restart of the daemon alone.
	onStopLeave = "leave"
)

// stopBound bounds the stop's parks; each CRIU dump has its own deadline
// within it.
const stopBound = 15 * time.Minute

// extendEvery is how often a long start or stop asks systemd for more
// time (three times this, each time).
const extendEvery = 10 * time.Second

// onStopPolicy is --on-stop as given, or its default, park: a stop
// that leaves runs executing loses them if the host then goes down.
func onStopPolicy(flag string) string {
	if flag != "" {
		return flag
	}
	return onStopPark
}

// service is serve's part around the daemon: what it tells systemd, and
// what the daemon's start and stop do with its runs.
type service struct {
	d      *daemon.Daemon
	notify *notifier
	onStop string
	socket string
	log    *slog.Logger
	// metrics is --metrics-listen's server, if any: it serves through the
	// stop's parks and is closed before the daemon shuts down.
	metrics *http.Server
	// stopping is set once the stop began: the watchdog is fed through
	// it, the API being shut down.
	stopping atomic.Bool
	// postCopyWait bounds how long a stop serves the runs held for
	// post-copy targets (serve --post-copy-wait, at most
	// maxPostCopyWait).
	postCopyWait time.Duration
	// holds waits until no run held here is being fetched by its
	// post-copy target, or its context ends, and returns the holds left
	// (member.WaitHolds).
	holds func(context.Context) ([]store.Hold, error)
}

// The stop's own waits, besides its parks (which ask systemd for more
// time): the socket API's end, the post-copy holds (--post-copy-wait at
// most), the peer API's end and the daemon's shutdown fit together in
// the unit's TimeoutStopSec=90 (deploy/systemd/runrecordd.service).
const (
	apiStopBound    = 15 * time.Second
	maxPostCopyWait = 30 * time.Second
	peerStopBound   = 10 * time.Second
	daemonStopBound = 30 * time.Second
)

// shutdowner is a server the stop shuts down (http.Server).
type shutdowner interface{ Shutdown(context.Context) error }

// stopServing applies the stop policy (stopRuns), the socket API already
// shut down, then serves the runs held here for post-copy targets while
// a target fetches one (member.FetchIdle), within postCopyWait
// (docs/fleet.md, "Post-copy"), and only then shuts the peer API down
// (peers, when not nil), within peerStopBound of its own: the targets
// fetch through the parks and the wait. A target that does not hold its
// run by then fetches the rest once this host serves again. systemd is asked for more time throughout.
func (s *service) stopServing(peers shutdowner) error {
	defer s.notify.Extending(extendEvery)()
	s.stopRuns()
	if peers == nil {
		return nil // no target reaches this host
	}
	if s.postCopyWait > 0 && s.holds != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.postCopyWait)
		hs, err := s.holds(ctx)
		cancel()
		if len(hs) > 0 || err != nil {
			s.log.Warn("stopping with runs held for post-copy targets; they fetch the rest once this host is back", "runs", len(hs), "wait", s.postCopyWait, "err", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerStopBound)
	defer cancel()
	return peers.Shutdown(ctx)
}

// started runs once the socket serves: the runs the last stop parked are
// resumed, after the image-park probe (daemon.ComeBack), and then systemd
// hears READY=1. The returned function ends the watchdog's pings.
func (s *service) started(ctx context.Context) (stop func()) {
	extending := s.notify.Extending(extendEvery)
	for _, e := range s.d.ComeBack(ctx, daemon.DefaultParkAllParallel) {
		if e.Answer != nil {
			s.log.Info("start: resumed a run the last stop parked", "run", e.Run)
		}
	}
	extending()
	if err := s.notify.Ready(); err != nil {
		s.log.Warn("telling systemd the daemon is ready", "err", err)
	}
	return s.notify.KeepAlive(s.healthy)
}

// healthy says whether the daemon answers on its socket (the watchdog's
// test), or is stopping.
func (s *service) healthy() bool {
	if s.stopping.Load() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(s.notify.Watchdog()/4, time.Second))
	defer cancel()
	_, err := api.NewClient(s.socket).Host(ctx)
	return err == nil
}

// beginStop tells systemd the daemon stops.
func (s *service) beginStop() {
	s.stopping.Store(true)
	if err := s.notify.Stopping(); err != nil {
		s.log.Warn("telling systemd the daemon stops", "err", err)
	}
}

// stopRuns applies the stop policy, the API already shut down: with park,
// every executing run is parked (stopServing asks systemd for more time
// while the parks go on).
func (s *service) stopRuns() {
	if s.onStop != onStopPark {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopBound)
	defer cancel()
	start := time.Now()
	runs, err := s.d.ParkForStop(ctx, daemon.DefaultParkAllParallel)
	if err != nil {
		s.log.Error("stop: executing runs not parked; they are left running", "err", err)
		return
	}
	parked := 0
	for _, e := range runs {
		if e.Answer != nil {
			parked++
		}
	}
	s.log.Info("stop: parked the executing runs", "parked", parked, "not_parked", len(runs)-parked, "took", time.Since(start))
}
