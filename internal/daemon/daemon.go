// Package daemon is runrecordd's host daemon: it joins the store, the
// executor, the meter, the attestation signer and the resume preconditions
// into the operations the API offers — run, park, resume, close, verify,
// show, export and import. What it stands on, its state directory among
// it, is internal/host's.
//
// # Ordering
//
// Every operation on one run holds that run's lock from start to end, so
// two operations on a run never interleave. Each transition keeps the order
// that makes a crash at any step leave a record that verifies: objects are
// durable before the segments that name them; a park appends its Executed
// and Suspended segments in one transaction before the sandbox is
// destroyed; a resume restores the sandbox before it appends Resumed; a
// close appends before it kills. [New] reconciles what containerd has with
// what the records say (see docs/daemon.md).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/host"
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/metrics"
	"github.com/runrecordd/runrecordd/internal/retention"
	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Config configures a Daemon.
type Config struct {
	// Config is what the host stands on: its state directory, containerd,
	// meter, /proc/cpuinfo and logger (internal/host).
	host.Config
	// Each room's settings, where the room documents them: a park's
	// limits (internal/forms), the store's retention (internal/retention),
	// what a bundle may bring (internal/bundle), and the fleet this host
	// joins (internal/fleet/member).
	forms.ParkLimits
	retention.Policy
	bundle.Intake
	member.Join
}

// Daemon is one host's runrecordd.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	base   *host.Host // what it stands on (nil in unit tests of a fake)
	st     *store.Store
	ex     Sandboxes // the executor (forms.Exec), a fake in unit tests
	meter  *idle.Meter
	keyID  record.Address
	keys   trust.Keys        // the host keys trusted here (admitted to the fleet too)
	signer *interval.Signer  // the host key and its audit chain
	host   manifest.Manifest // the host's own facts and runtime versions
	// intervals and forms are this host's side of every interval and of
	// both forms, wired once (wireForms).
	intervals interval.Recorder
	forms     forms.Env
	secrets   *secrets.Host // runs' secret values here (secrets.go)
	stop      context.CancelFunc
	bgCtx     context.Context // done once the daemon stops
	bg        sync.WaitGroup

	mu   sync.Mutex
	runs map[string]*run
	// fleet is the daemon's part in a fleet (internal/fleet/member); alone, it
	// appends to the store directly.
	fleet *member.Member
	// exports keeps the books of this process's exports (bundle.Exports);
	// exporter makes them (wireExports).
	exports  bundle.Exports
	exporter bundle.Exporter

	metrics metrics.Metrics
	events  events.Hub
	probe   *imageparks.Gate
	// rooms are the rooms that answer without a run's lock (Rooms).
	rooms Rooms

	// stopping is set once the daemon parks its runs to stop
	// (ParkForStop): no run starts or resumes after it.
	stopping atomic.Bool
	// comebacks are the runs to resume at the next start (comebacklist.go).
	comebackOnce sync.Once
	comebacks    *comebackList

	// seam, set by unit tests only, runs at each step an operation
	// reaches (reach).
	seam func(step string)
}

// run is a run's state on this host beyond its record.
type run struct {
	mu   sync.Mutex // held for a whole operation on the run
	live *live      // the sandbox, while executing here
	park *idle.Park // the park, while parked here since this daemon started
	// teardown is closed once the sandbox of the run's last park on this
	// host is destroyed.
	teardown chan struct{}
}

// New opens the state directory, connects to (or starts) containerd, and
// reconciles the sandboxes it finds with the records.
func New(ctx context.Context, cfg Config) (*Daemon, error) {
	h, err := host.Open(ctx, cfg.Config)
	if err != nil {
		return nil, err
	}
	cfg.Config = h.Config
	d := &Daemon{cfg: cfg, log: cfg.Logger, runs: map[string]*run{}, base: h, st: h.Store,
		ex: forms.Exec{Client: h.Exec}, meter: h.Meter, signer: h.Signer, keyID: h.Signer.KeyID(), host: h.Facts}
	if h.Warm != nil {
		d.metrics.WarmFrom(h.Warm.Stats)
	}
	d.metrics.CRIUFrom(metrics.CRIUInfo{Version: h.Facts[manifest.CRIUVersion], Known: h.CRIU.Manifest != nil, Patches: h.CRIU.Patches()})
	ok := false
	defer func() {
		if !ok {
			d.Shutdown(context.Background())
		}
	}()
	d.joinFleet()
	d.wire()
	bg, stop := context.WithCancel(context.Background())
	d.stop, d.bgCtx = stop, bg
	d.background(func() { _ = d.meter.Run(bg) })
	if err := d.reconcile(ctx); err != nil {
		return nil, fmt.Errorf("daemon: reconcile: %w", err)
	}
	d.startProbe(h.CRIUErr)
	d.serviceMetrics()
	d.background(func() { d.rooms.Collector.Run(d.bgCtx) })
	d.fleet.Watch(bg, &d.bg)
	ok = true
	return d, nil
}

// Rooms are the rooms the daemon wires once, in New, that internal/server
// and serve use directly: all but the exporter answer without a run's
// lock.
type Rooms struct {
	Store     *store.Store        // records, objects, units, the call ledger
	Keys      trust.Keys          // the host keys trusted here
	Collector retention.Collector // the store's collection (GC on demand)
	Events    *events.Hub         // the watchers' hub
	Counts    *metrics.Metrics    // what the daemon counts (Failed)
	Metrics   http.Handler        // /metrics (internal/metrics)
	Scrape    http.Handler        // serve --metrics-listen's /metrics: no label names a run
	Objects   http.Handler        // the host's objects by address, to its fleet's hosts (internal/fleet/transfer)
	Exporter  bundle.Exporter     // exports, each under its run's lock while judged and handed off
}

// wire makes the rooms the daemon holds from its store, key, meter,
// configuration and fleet, once (New; the unit tests' harness).
func (d *Daemon) wire() {
	d.wireForms()
	d.exporter = d.wireExports()
	d.keys = trust.Keys{Store: d.st, Self: d.keyID, Log: d.log, Admitted: func(k record.Address) bool { return d.fleet.Admitted(k) }}
	src := metrics.HostSource(d.st, d.meter)
	d.rooms = Rooms{Store: d.st, Keys: d.keys, Collector: retention.NewCollector(d.st, d.cfg.Policy, d.log), Events: &d.events,
		Counts: &d.metrics, Metrics: d.metrics.Handler(src, d.log), Scrape: d.metrics.ScrapeHandler(src, d.log), Objects: transfer.Handler(d.st), Exporter: d.exporter}
}

// Rooms returns the rooms the daemon wired at New.
func (d *Daemon) Rooms() Rooms { return d.rooms }

// Shutdown stops the daemon's own work, then closes what it stands on
// (host.Host.Close). Sandboxes keep running (a restarted daemon reattaches
// to them), and so do a supervised containerd's shims; the embedded
// containerd itself is stopped.
func (d *Daemon) Shutdown(ctx context.Context) error {
	if d.stop != nil {
		d.stop()
	}
	d.events.Stop()
	// Transcript units lose their channels with this process; the next
	// start parks them from the transcripts left on disk.
	d.mu.Lock()
	for _, r := range d.runs {
		r.mu.Lock()
		if r.live != nil {
			r.live.unit.Stop()
		}
		r.mu.Unlock()
	}
	d.mu.Unlock()
	d.bg.Wait()
	var errs []error
	if d.fleet != nil {
		errs = append(errs, d.fleet.Close(ctx)) // a session it made after a lost lease
	}
	if d.base != nil {
		errs = append(errs, d.base.Close(ctx))
	}
	return errors.Join(errs...)
}

// lockRun returns the state of run id, which must be stored, locked: a
// request naming no run leaves nothing behind (d.runs holds only runs that
// exist or are being created). The caller unlocks it.
func (d *Daemon) lockRun(id string) (*run, error) {
	if _, err := d.st.Run(id); err != nil {
		return nil, err
	}
	return d.lock(id), nil
}

// lock returns run id's state, locked, making it for a run being created.
// The caller unlocks it.
func (d *Daemon) lock(id string) *run {
	d.mu.Lock()
	r := d.runs[id]
	if r == nil {
		r = &run{}
		d.runs[id] = r
	}
	d.mu.Unlock()
	r.mu.Lock()
	return r
}

func nowNS() int64 { return time.Now().UnixNano() }
