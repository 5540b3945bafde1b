// Package member is a host's part in a fleet (docs/fleet.md): its session
// in the run directory and the fence every append goes through; rejoining
// after a lost lease, and freezing its units while the lease is
// unconfirmed; reconciling its store with the directory at start;
// migrations out and in, adoption, and a drain's placement. It never
// imports the daemon, which keeps the run table and its locks: the daemon
// hands it a run as one operation holds it (Held), and its units as a
// whole (Units).
//
// Alone (no Config.Fleet) a Member reserves nothing and claims nothing:
// Records is the store itself.
package member

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// ErrNoFleet is a fleet operation asked of a host that is not in a fleet.
var ErrNoFleet = errors.New("this host is not in a fleet")

// Peers are the fleet's other hosts as this host uses them: internal/
// server reaches them on their mutual-TLS listeners (internal/fleet/peer), at
// the address their session gives (fleet.Member.Peer), pinned to their key.
type Peers interface {
	// Hand asks host to take the run this host handed to it in the
	// fleet: it checks the directory names it the transfer's target,
	// fetches, imports and claims the run, and resumes it when the run
	// was executing here. owing says the host took the run post-copy:
	// it fetches slabs of it after the answer, and says Done.
	Hand(ctx context.Context, host record.Address, h Handed) (owing bool, _ error)
	// Source is host's objects, read by a post-copy migration's target
	// (transfer.Owed) until done is called.
	Source(ctx context.Context, host record.Address) (_ transfer.Source, done func(), _ error)
	// Done tells host, the source of a post-copy migration of run h.Run,
	// that this host holds every object of it, or needs none (closed).
	Done(ctx context.Context, host record.Address, h Handed) error
	// Held asks host, the source of a post-copy migration of run h.Run,
	// whether it still holds the run for this host at h.Head. An error
	// (the link; an older source, which lacks the route) is not an answer:
	// only false says the source will serve the run no more.
	Held(ctx context.Context, host record.Address, h Handed) (bool, error)
	// Fetch brings run's record from host (at most opt.Limits.JSON bytes
	// of it), has judge judge it, and only then brings every object it
	// reaches that the store lacks, each verified by its address, staged
	// and held to opt (transfer.Stage), over one connection; the caller
	// judges the objects where they are and adopts them.
	Fetch(ctx context.Context, host record.Address, run string, judge func(*record.Record) error, opt FetchOptions) (*record.Record, Arrival, error)
	// Offer asks host what it can take now, naming the images the runs to
	// place need.
	Offer(ctx context.Context, host record.Address, images []string) (drain.Offer, error)
	// Expect tells host that run genesis is about to be handed to it
	// (Member.Expect there). An error (an older host lacks the route)
	// changes nothing.
	Expect(ctx context.Context, host, genesis record.Address) error
}

// Handed is a migration as its source names it to the target: the run's
// id there, the genesis and head of the directory's entry, and whether
// the run was executing (the target resumes it), and whether the source
// holds the run for the target (sent only to a target whose offer has
// PostCopy): only then may the target owe slabs, which a source not
// holding it would stop serving.
type Handed struct {
	Run           string
	Genesis, Head record.Address
	Resume        bool
	Held          bool
}

// FetchOptions are what a received run's objects are held to: the store
// they go to, a bundle's limits, and the room the store's filesystem has
// for them (Free: past serve --min-free, less what post-copy migrations
// are owed already, Member.Reserved).
type FetchOptions struct {
	Store  *store.Store
	Limits bundle.Limits
	Free   func() (uint64, error)
	// Owe: the slabs of the run's last memory image are owed to the
	// store, fetched after the run is stored (post-copy).
	Owe bool
	// Rehashed: held objects rehashed ahead of the fetch, and when
	// (transfer.Options.Rehashed).
	Rehashed func(record.Address) (time.Time, bool)
}

// Arrival is a received run's objects, staged (transfer.Fetched): judged
// where they are by bundle.ImportStored, adopted as the run is stored,
// and removed by Close when it is not.
type Arrival interface {
	bundle.Holding
	Close() error
}

// Held is a run as one operation on this host holds it (the daemon's run
// lock): parked or resumed by the daemon's own sequences.
type Held interface {
	// Executing says whether the run's unit executes here.
	Executing() bool
	// Need is what the run asks of the host that takes it (its manifest:
	// the recorded one, or the one its park here would record).
	Need(ctx context.Context) (drain.Need, error)
	Park(ctx context.Context) error
	Resume(ctx context.Context) error
	// Freeze pauses the run's unit if it executes here, and returns what
	// thaws it if it is still the run's unit then (nil when it paused
	// nothing).
	Freeze(ctx context.Context) (thaw func(context.Context), err error)
	// Drop destroys the run's sandbox here, if it has one, appending
	// nothing: another host took the run while this one was cut off.
	Drop()
}

// Runs are this host's runs as the member room takes hold of them (the
// daemon's run table and its locks). Hold holds run id for one operation —
// a stored run, or with fresh one not stored yet (a run being received) —
// until the function it returns lets it go.
// Idle holds, one after another, every run in the table that no operation
// holds now, and calls fn with it held.
type Runs interface {
	Hold(id string, fresh bool) (Held, func(), error)
	Idle(fn func(id string, h Held))
}

// Metrics are what a Member counts (internal/metrics).
type Metrics interface {
	Migrated(out, ok bool, took time.Duration)
	Drained(moved bool)
	OwnershipRefused()
}

// Join is the fleet a host joins (serve --etcd, docs/fleet.md).
type Join struct {
	// Fleet is this host's session in a fleet (internal/fleet): a run is
	// claimed in etcd when it starts, and every advance of its record is
	// reserved there before it is appended. Nil runs alone, as without
	// --etcd.
	Fleet *fleet.Session
	// Rejoin starts a new session of this host in the fleet, after the
	// last one's lease was lost (etcd out of reach for longer than the
	// lease's time to live); nil, a lost lease is not replaced.
	Rejoin func(ctx context.Context) (*fleet.Session, error)
	// Peers reach the fleet's other hosts for migrations and drains; nil,
	// this host neither sends nor takes runs.
	Peers Peers
	// PostCopy receives a run post-copy: stored and claimed before the
	// slabs of its last memory image are here, which are then fetched in
	// the background (postcopy.go); one that was executing is resumed
	// lazily meanwhile, each chunk it needs fetched first (lend.go).
	PostCopy bool
	// PostCopyWait bounds how long a drain's end waits for the post-copy
	// targets fetching the runs held here (WaitHolds) to hold them (serve
	// --post-copy-wait).
	PostCopyWait time.Duration
}

// Config configures a Member.
type Config struct {
	Join
	Store   *store.Store
	Log     *slog.Logger
	Metrics Metrics
	Publish func(events.Event)
	// Reach marks a step of a migration (failpoints, test seams).
	Reach func(step string)
	// Import judges a received run as a bundle import would: limits,
	// trusted signers, the host's mount policy, the id check.
	Import bundle.ImportOptions
	// Exportable says whether a run may leave this host now.
	Exportable func(id string) error
	// Runs are the host's runs, held for migrations, adoptions and drains.
	Runs Runs
	// HandedOff tells that stored run id is handed off here, another
	// host's for good (a migration out the target claimed, a received
	// run handed back): what it held on this host goes. Nil, nothing.
	HandedOff func(id string)
	// Fits says why this host could not resume stored run id now (its
	// recorded environment manifest against this host's): a received run
	// that does not fit is not taken. Nil takes every run.
	Fits func(ctx context.Context, id string) error
	// MinFree is the free space a received run leaves on the store's
	// filesystem (serve --min-free; park.DefaultMinFree when 0).
	MinFree uint64
	// MaxReceives bounds the receives one host may have under way here at
	// once ([DefaultMaxReceives] when 0).
	MaxReceives int
}

// Member is a host's part in its fleet.
type Member struct {
	// draining, once set by Drain, refuses new runs and runs moved here.
	draining atomic.Bool
	cfg      Config
	// rejoined is the session that replaced cfg.Fleet's after its lease
	// was lost.
	rejoined atomic.Pointer[fleet.Session]
	// serving are the transfers this host serves now (serve.go).
	serving grants
	// receiving counts the receives under way, by calling host.
	receiving counter
	// sending holds a slot per migration under way from here, by target.
	sending sendSlots
	// paying are the post-copy receives bringing their slabs in
	// (postcopy.go).
	paying payers
	// arriving are the bytes of slabs owed to receives fetched and not
	// stored yet (Reserved).
	arriving atomic.Int64
	// expect is the rehash ahead of a migration here (expect.go).
	expect expected
}

// New makes a Member.
func New(cfg Config) *Member {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	m := &Member{cfg: cfg}
	m.paying.ctx, m.paying.stop = context.WithCancel(context.Background())
	return m
}

// Draining says whether a drain began on this host: it takes no new runs,
// nor runs moved here, until it restarts.
func (m *Member) Draining() bool { return m.draining.Load() }

// stored holds stored run id (Runs.Hold).
func (m *Member) stored(id string) Hold {
	return func() (Held, func(), error) { return m.cfg.Runs.Hold(id, false) }
}

// fresh holds run id, stored or not yet (Runs.Hold).
func (m *Member) fresh(id string) Hold {
	return func() (Held, func(), error) { return m.cfg.Runs.Hold(id, true) }
}

// Session is this host's current session in the fleet: Config.Fleet's, or
// the one that replaced it after its lease was lost; nil alone.
func (m *Member) Session() *fleet.Session {
	if h := m.rejoined.Load(); h != nil {
		return h
	}
	return m.cfg.Fleet
}

// Admitted says whether key is a host admitted to the fleet: the fleet's
// hosts' keys are its trusted set (docs/fleet.md). Alone, none is.
func (m *Member) Admitted(key record.Address) bool {
	h := m.Session()
	if h == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mb, err := h.Member(ctx, key)
	return err == nil && mb.Role == fleet.RoleHost
}

// ClaimImported makes a run imported from a bundle this host's
// (docs/fleet.md, "Bundles in a fleet"): claimed at the record's head —
// which the directory allows for a run it has no entry for (one from
// outside the fleet), one transferred to this host, and one whose owner
// is gone. Refused (another live host owns it, or holds it further on),
// the run is stored here all the same, and inert: the fence refuses its
// every advance (a resume is refused not_owner) until it is adopted or
// claimed. The refusal is returned. A copy bundle's run is never claimed;
// alone, nothing is.
func (m *Member) ClaimImported(ctx context.Context, im bundle.Imported) error {
	h := m.Session()
	if h == nil || im.Header.Copy {
		return nil
	}
	rec := im.Record
	if _, err := h.Claim(ctx, rec.Genesis(), im.Run, rec.Head(), rec.Phase()); err != nil {
		m.cfg.Log.Warn("fleet: the imported run is another host's; it is stored here, not resumable", "run", im.Run, "err", err)
		return m.Err(err)
	}
	return nil
}

// EndFetches ends the post-copy fetches under way and starts none after
// (a next start goes on with them): a resume waiting on one is refused
// (store.ErrOwed). A stop calls it before it takes the runs' locks.
func (m *Member) EndFetches() { m.paying.close() }

// Close ends the post-copy fetches (EndFetches) and the session this
// Member made (the first is its caller's).
func (m *Member) Close(ctx context.Context) error {
	m.EndFetches()
	if h := m.rejoined.Load(); h != nil {
		return h.Close(ctx)
	}
	return nil
}

// Err counts err when it is the fleet's refusal of a transition
// (runrecordd_ownership_refusals_total), and returns it.
func (m *Member) Err(err error) error {
	if errors.Is(err, fleet.ErrNotOwner) || errors.Is(err, fleet.ErrHeadMoved) || errors.Is(err, fleet.ErrLeaseLost) {
		m.cfg.Metrics.OwnershipRefused()
	}
	return err
}

// moving says why this host cannot move runs: not in a fleet, or no peers.
func (m *Member) moving(op, id string) error {
	if m.Session() == nil || m.cfg.Peers == nil {
		return fmt.Errorf("%s %s: %w", op, id, ErrNoFleet)
	}
	return nil
}

func (m *Member) reach(step string) {
	if m.cfg.Reach != nil {
		m.cfg.Reach(step)
	}
}
