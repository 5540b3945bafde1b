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
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
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
	// EgressAllow is the host's egress ceiling (serve --egress-allow):
	// the IPv4 networks an egress grant's destinations must lie in, for
	// a run started here, imported, or received from a peer. Empty: no
	// egress grant is taken, and no sandbox is linked out.
	EgressAllow []netip.Prefix
	// EgressResolver is the upstream resolver the runs' names are asked
	// of (serve --egress-resolver), reached from the daemon's network
	// namespace; zero: none, and no egress grant may name a destination.
	EgressResolver netip.AddrPort
	// Egress is how this host links runs out beyond its ceiling: zero
	// values take the defaults (EgressLinks).
	Egress EgressLinks
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
	// both forms, wired once (wire).
	intervals intervals
	forms     forms.Env
	secrets   *secrets.Values // runs' secret values here (secrets.go)
	links     *links          // runs' links out (egress.go); nil where the host grants no egress
	stop      context.CancelFunc
	bgCtx     context.Context // done once the daemon stops
	bg        sync.WaitGroup

	// runs are this host's runs beyond their records, each under its
	// lock (runs.go).
	runs *runTable
	// fleet is the daemon's part in a fleet (internal/fleet/member); alone, it
	// appends to the store directly.
	fleet *member.Member
	// bundles are how this host judges a bundle, or a run received from a
	// peer (wire).
	bundles bundle.Options
	// exports keeps the books of this process's exports (bundle.Exports);
	// exporter makes them, under the run's lock (wire).
	exports  bundle.Exports
	exporter bundle.Exporter
	// place is this host's side of a drain's placement (internal/fleet/drain).
	place drain.Local

	metrics metrics.Metrics
	events  events.Hub
	probe   *imageparks.Gate
	// rooms are the rooms that answer without a run's lock (Rooms).
	rooms Rooms

	// stopping is set once the daemon parks its runs to stop
	// (ParkForStop): no run starts or resumes after it.
	stopping atomic.Bool
	// comebacks are the runs to resume at the next start (comebacklist.go).
	comebacks *comebackList

	// reach marks a step of an operation: a failpoint armed for it fires,
	// and a unit test's seam (set by unit tests only) runs there — a test
	// of the daemon's refusal branches makes the store refuse at exactly
	// that step.
	reach func(step string)
	seam  func(step string)
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
	d := &Daemon{cfg: cfg, log: cfg.Logger, runs: &runTable{st: h.Store}, base: h, st: h.Store,
		ex: forms.Exec{Client: h.Exec}, meter: h.Meter, signer: h.Signer, keyID: h.Signer.KeyID(), host: h.Facts}
	if len(cfg.EgressAllow) > 0 {
		if d.links, err = openLinks(cfg.StateDir, cfg.EgressAllow, cfg.Egress, d.log); err != nil {
			return nil, errors.Join(err, h.Close(ctx))
		}
	}
	if h.Warm != nil {
		d.metrics.WarmFrom(h.Warm.Stats)
	}
	d.metrics.CRIUFrom(metrics.CRIUInfo{Version: h.Facts[manifest.CRIUVersion], Known: h.CRIU.Record != nil, Patches: h.CRIU.Patches(), Off: h.CRIUOff})
	ok := false
	defer func() {
		if !ok {
			d.Shutdown(context.Background())
		}
	}()
	d.wire()
	if d.links != nil && cfg.EgressResolver.IsValid() {
		if err := d.links.serveNames(d, cfg.EgressResolver); err != nil {
			return nil, fmt.Errorf("daemon: %w", err)
		}
	}
	bg, stop := context.WithCancel(context.Background())
	d.stop, d.bgCtx = stop, bg
	d.bg.Go(func() { _ = d.meter.Run(bg) })
	if err := d.reconcile(ctx); err != nil {
		return nil, fmt.Errorf("daemon: reconcile: %w", err)
	}
	// The image-park gate joins the forms once its probe starts.
	d.probe = imageparks.Start(bg, &d.bg, probeFor(d.ex, h.CRIU, cfg), h.CRIUErr, d.log)
	d.forms.Gate = d.probe
	serviceMetrics(&d.metrics, h, d.probe)
	d.bg.Go(func() { d.rooms.Collector.Run(bg) })
	d.fleet.Watch(bg, &d.bg)
	ok = true
	return d, nil
}

// Rooms are the rooms the daemon wires once, in New, that internal/server
// and serve use directly: all but the exporter and the fleet answer
// without a run's lock.
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
	// Fleet is the daemon's part in a fleet: its migrations, adoptions
	// and drains (internal/fleet/member), over the daemon's run table.
	Fleet *member.Member
	// Placement is what this host can take now, asked before a drain
	// (drain.Local.Offer).
	Placement *drain.Local
}

// wire makes the rooms the daemon holds from its store, key, meter,
// configuration and fleet, once (New; the unit tests' harness, again
// after each change it makes): the fleet's member room, this host's side
// of every interval and of both forms, its exports, its placement and
// the list of runs to resume at start. The image-park gate joins the
// forms when its probe starts (New).
func (d *Daemon) wire() {
	d.reach = func(step string) {
		failpoint.Fire(step)
		if d.seam != nil {
			d.seam(step)
		}
	}
	// The trusted signers are the keys as wired when asked: the member
	// room takes these before the keys are made.
	policy := bundle.HostPolicy(d.cfg.BundleMounts, d.cfg.StateDir)
	// handedOff frees what a run held on this host, now another host's:
	// its egress link and slot, and its secrets' values (an export's
	// handoff, a migration out, a received run handed back).
	handedOff := func(id string) {
		d.links.Release(id)
		dropSecrets(d.secrets, id, d.log)
	}
	policy.EgressAllow, policy.EgressNames = d.cfg.EgressAllow, d.cfg.EgressResolver.IsValid()
	d.bundles = bundle.Options{Limits: d.cfg.BundleLimits, Trusted: func(k record.Address) bool { return d.keys.Trusted(k) }, Policy: policy}
	d.fleet = member.New(member.Config{
		Join:  d.cfg.Join,
		Store: d.st, Log: d.log, Metrics: &d.metrics, Publish: d.events.Publish, Reach: d.reach,
		Import:     bundle.ImportOptions{Options: d.bundles, CheckID: forms.CheckID},
		Exportable: func(id string) error { return d.exporter.Exportable(id) }, Runs: fleetRuns{d}, HandedOff: handedOff,
		Fits:    func(ctx context.Context, id string) error { return d.place.Fits(ctx, id) },
		MinFree: d.cfg.MinFree,
	})
	d.intervals = intervals{Recorder: interval.Recorder{StateDir: d.cfg.StateDir, Signer: d.signer, Meter: interval.IdleMeter{M: d.meter}, Log: d.log},
		fleet: d.fleet, metrics: &d.metrics, reach: d.reach}
	if d.links != nil {
		d.intervals.Traffic = d.links
	}
	output := func(id string) (executor.Output, error) {
		out, err := d.intervals.MakeOutput(id)
		return executor.Output(out), err
	}
	d.secrets = secrets.New(d.cfg.StateDir)
	d.forms = forms.Env{Store: d.st, Sandboxes: d.ex, StateDir: d.cfg.StateDir, Facts: d.host, Gate: d.probe, CRIUDeadline: d.cfg.CRIUDeadline,
		MinFree: d.cfg.MinFree, Calls: callHost{d}, Output: output, Mark: d.intervals.MarkNow, Invalid: answers.ErrInvalid, Log: d.log, Lazy: forms.LazyOf(d.ex, d.cfg.LazyResume), LazyServed: d.cfg.LazyServed,
		HostRootImages: d.cfg.HostRootImages, Secrets: d.secrets}
	if d.links != nil {
		d.forms.Links = d.links
	}
	if d.base != nil { // none in the daemon's unit tests
		d.forms.Warm, d.forms.Creates = d.base.Warm, forms.Creates(d.base.Exec)
		if d.base.Config.UserNS {
			d.forms.Ranges = d.base.Ranges
		}
	}
	d.exporter = bundle.Exporter{Store: d.st, Books: &d.exports, Lock: func(id string) (func(), error) { return d.runs.locker(id) }, Held: func(id string) ([]string, error) { return calls.Held(d.st, id) },
		Log: d.log, HandedOff: func(id string) {
			handedOff(id)
			d.events.Publish(events.Event{Kind: "run.handed_off", Run: id})
		}}
	d.place = drain.Local{Store: d.st, Facts: d.host, Digest: digestOf(d.ex), MinFree: d.cfg.MinFree, Draining: d.fleet.Draining,
		ImageParks: func() bool { return d.probe.Status().State != imageparks.Unavailable }, Forms: &d.forms,
		EgressAllow: d.cfg.EgressAllow, EgressNames: d.cfg.EgressResolver.IsValid(),
		PostCopy: d.cfg.PostCopy && d.forms.Lazy != nil && d.forms.LazyServed, Reserved: d.fleet.Reserved}
	d.comebacks = openComeback(d.cfg.StateDir)
	d.keys = trust.Keys{Store: d.st, Self: d.keyID, Log: d.log, Admitted: d.fleet.Admitted}
	src := metrics.HostSource(d.st, d.meter)
	d.rooms = Rooms{Store: d.st, Keys: d.keys, Collector: retention.NewCollector(d.st, d.cfg.Policy, d.log), Events: &d.events,
		Counts: &d.metrics, Metrics: d.metrics.Handler(src, d.log), Scrape: d.metrics.ScrapeHandler(src, d.log), Objects: transfer.Handler(d.st),
		Exporter: d.exporter, Fleet: d.fleet, Placement: &d.place}
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
	if d.fleet != nil {
		// A resume waiting on a post-copy fetch holds its run's lock,
		// taken below: the fetch ends first.
		d.fleet.EndFetches()
	}
	var errs []error
	if d.links != nil {
		errs = append(errs, d.links.closeNames()) // no query waits on a run's lock
	}
	// Transcript units lose their channels with this process; the next
	// start parks them from the transcripts left on disk.
	for _, r := range d.runs.all() {
		r.mu.Lock()
		if r.live != nil {
			r.live.unit.Stop()
		}
		r.mu.Unlock()
	}
	d.bg.Wait()
	if d.fleet != nil {
		errs = append(errs, d.fleet.Close(ctx)) // a session it made after a lost lease
	}
	if d.base != nil {
		errs = append(errs, d.base.Close(ctx))
	}
	if d.links != nil {
		errs = append(errs, d.links.close())
	}
	return errors.Join(errs...)
}

func nowNS() int64 { return time.Now().UnixNano() }
