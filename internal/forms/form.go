package forms

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/warmpool"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Env is this host's side of both forms: the store, the sandboxes, the
// image-park gate and CRIU's deadline, the room an image park must leave,
// and where a run's channel and output go. It holds no state of its own:
// a value is cheap to make, and the daemon makes one at each use (a unit
// reattached at start outlives the host it was found with: the gate is
// set after the reconcile).
type Env struct {
	Store     *store.Store
	Sandboxes Sandboxes
	StateDir  string
	// Facts are the host's own facts and runtime versions, which its
	// environment manifests record.
	Facts manifest.Manifest
	// Gate is the image-park gate every image park and resume waits on.
	Gate *imageparks.Gate
	// CRIUDeadline is the configured deadline of a dump or restore; 0
	// derives it from the memory moved (imageparks.Deadline).
	CRIUDeadline time.Duration
	// MinFree is the free space an image park leaves (park.Room).
	MinFree uint64
	// Lazy, when set, restores image parks lazily (docs/lazy-resume.md;
	// serve --lazy-resume); nil restores them eagerly.
	Lazy LazyRestorer
	// LazyServed, with Lazy, has a page server verify each chunk as it
	// is first served (park.OfferedServed, park.LayoutServed).
	LazyServed bool
	// Warm is the host's warm pool (internal/warmpool, docs/warm-pool.md)
	// and Creates makes its sandboxes, created and not started; a nil pool
	// keeps none.
	Warm    *warmpool.Pool
	Creates Creator
	// Ranges, when set, runs units in user namespaces: each run's
	// sandboxes map its ids 0..65535 to the range it holds, taken at its
	// first sandbox here (a warm one's too) and released when the run
	// closes; nil runs them as the host's root. An image unit runs in one
	// only where the gate's probe dumped and restored in one (Gate.UserNS).
	Ranges *idmap.Ranges
	// HostRootImages accepts image units as the host's root (serve
	// --allow-host-root-images): where the probe's dump and restore in a
	// user namespace failed, and for a park made without one.
	HostRootImages bool
	// Secrets holds runs' secret values here: a run that names secrets
	// has its directory of them mounted read-only at secrets.Target in
	// every sandbox (docs/trust.md#secrets).
	Secrets *secrets.Values
	// Links links out the sandboxes of runs granted network egress; nil
	// where the host grants none (serve --egress-allow).
	Links Linker
	// Calls is what a transcript unit's channel tells the daemon.
	Calls calls.Daemon
	// Output makes run's output files on this host; Mark is a mark at
	// this instant for them. An interval begins at the mark.
	Output func(run string) (executor.Output, error)
	Mark   func(run string) interval.Mark
	// Invalid is the error a request that cannot be carried out wraps (a
	// channel path too long for its socket).
	Invalid error
	Log     *slog.Logger
}

// For is the form of units of mode m.
func (h Env) For(m unit.Mode) Form {
	if m == unit.TranscriptMode {
		return Transcript{h}
	}
	return Image{h}
}

// Orphan is run's unit on sb as a restarted daemon finds it: without a
// channel (the last one was the dead process's).
func Orphan(run Run, sb Sandbox) *Unit { return &Unit{Run: run, Sandbox: sb} }

// Run is the run a form works for: its id, unit and grants.
type Run struct {
	ID     string
	Spec   unit.Spec
	Grants unit.Grants
}

// Form is one mode's way to park and resume a unit (Image, Transcript).
type Form interface {
	// Ready refuses a new run id of this form where the form cannot park
	// it (it would hold its sandbox for good).
	Ready(ctx context.Context, id string) error
	// Start starts run's first sandbox.
	Start(ctx context.Context, run Run) (Woken, error)
	// Keys are the manifest keys a park of this form records (Taken.Keys).
	Keys() []string
	// Snapshot freezes u and takes its snapshot. Refused, it leaves u
	// running as it was; taken, u stays frozen until its park is recorded
	// (its sandbox is then destroyed) or refused (Thaw).
	Snapshot(ctx context.Context, u *Unit) (Taken, error)
	// Thaw undoes a park refused after its snapshot: the unit goes on.
	Thaw(ctx context.Context, u *Unit) error
	// Wake brings a parked run's unit back from its snapshot.
	Wake(ctx context.Context, run Run, w Waking) (Woken, error)
	// Reattached settles a unit the last daemon process left executing,
	// found in status. It reports whether the unit must be recovered
	// instead: parked from what it left on disk (Recover).
	Reattached(ctx context.Context, u *Unit, status string) (recover bool, err error)
	// Recover freezes a unit Reattached reported (or one found gone) and
	// takes its snapshot from what it left on disk, for a park recorded
	// without an account; sealed is the snapshot its interval began from
	// (nil for a run's first).
	Recover(ctx context.Context, u *Unit, sealed *record.Snapshot) (Taken, error)
}

// Taken is the snapshot a park took, before it is recorded.
type Taken struct {
	Snapshot record.Snapshot
	Retained int64
	Keys     []string        // the manifest keys its form records
	Details  []attest.Detail // lifecycle entries the interval journals
	// Checkpoint is an image park's CRIU statistics (also in Details).
	Checkpoint *attest.Checkpointed
	// Cleanup, when set, removes what the snapshot was taken from, once
	// the park is recorded and the sandbox destroyed.
	Cleanup func() error
}

// Waking is what a parked run wakes from.
type Waking struct {
	Snapshot record.Snapshot
	Retained int64 // the bytes the snapshot retains: what a restore moves
	// Teardown, when set, is closed once the sandbox of the run's last
	// park on this host is destroyed: an image restore takes its id.
	Teardown <-chan struct{}
	// Warm, when set, is the sandbox made ahead for this wake
	// (Transcript.Prepare): the form starts it if it is still the one
	// it would make now, and discards it otherwise. Either way the wake
	// owns it.
	Warm *Warm
	// Lazy restores an image park lazily (Admitted.Lazy); Asked, when
	// set, is called once the restore has asked the gate for a slot.
	Lazy  bool
	Asked func()
	// Owed is Admitted.Owed.
	Owed park.Owed
}

// Woken is a unit started or woken: its sandbox, and what its interval
// begins with.
type Woken struct {
	Unit  *Unit
	Event string        // the interval's first lifecycle event
	Mark  interval.Mark // where the interval begins
	// Details are lifecycle entries the resume journals; Restored is an
	// image resume's statistics (also in Details).
	Details  []attest.Detail
	Restored *attest.Restored
	// Warm is set when the unit was woken in a warm sandbox.
	Warm bool
}

// Unit is one sandbox of a run. It keeps no form: the daemon asks the
// form of its mode at each use (Env.For), over the host as it is then.
type Unit struct {
	Run
	Sandbox Sandbox
	ch      *calls.Channel // the transcript form's channel; nil without one
	pages   *pages         // a lazy restore's memory on its way in; nil without one
}

// Channel is the unit's channel, nil without one.
func (u *Unit) Channel() *calls.Channel { return u.ch }

// Hold holds what reaches the unit's account (its channel's gate) until
// release is called: nothing reaches the transcript or the account
// between a park's or a close's sealing and its record.
func (u *Unit) Hold() (release func()) {
	if u.ch == nil {
		return func() {}
	}
	u.ch.Gate().Lock()
	return u.ch.Gate().Unlock
}

// Account is the interval's call account. An image unit has no channel
// to dispatch through and no network beyond loopback: its interval
// accounts for no calls. A transcript unit whose channel was another
// process's is not accounted (nil).
func (u *Unit) Account() *record.CallAccount {
	switch {
	case u.ch != nil:
		return u.ch.Account()
	case u.Spec.Mode == unit.TranscriptMode:
		return nil
	}
	return &record.CallAccount{}
}

// Spool makes the channel's spooled entries part of iv's journal, and
// what became of a lazy restore's pages, once known (JournalPages).
func (u *Unit) Spool(iv *interval.Interval) {
	_ = u.JournalPages(iv)
	if u.ch != nil {
		iv.Channel(u.ch.Spooled)
	}
}

// Serve serves the unit's channel, if it has one, through spawn (in the
// daemon's background) until it is stopped or closed. The caller serves
// it once the run (or its Resumed segment) is stored and announced: until
// then the unit's hello waits in the listener's backlog.
func (u *Unit) Serve(spawn func(func())) {
	if ch := u.ch; ch != nil {
		spawn(func() { _ = ch.Serve() })
	}
}

// Stop stops serving the channel, leaving its directory for the next
// daemon to recover.
func (u *Unit) Stop() {
	if u != nil && u.ch != nil {
		u.ch.Stop()
	}
}

// Close ends the channel, removing its directory and spool.
func (u *Unit) Close() {
	if u != nil && u.ch != nil {
		u.ch.Close()
	}
}

// unitSpec is the sandbox spec of a unit of run: with userns, in the
// user namespace of the range the run holds here (taken now if it holds
// none), where the host runs units in user namespaces.
// restore says the sandbox is a restore's.
func (h Env) unitSpec(run Run, userns, restore bool) (executor.Spec, error) {
	es := executor.SpecOf(run.Spec, run.Grants)
	if len(run.Grants.Secrets) > 0 {
		if h.Secrets == nil {
			return es, fmt.Errorf("run %s: %w: this host keeps no secrets", run.ID, secrets.ErrRequired)
		}
		dir, err := h.Secrets.Dir(run.ID)
		if err != nil {
			return es, err
		}
		// Own: the daemon's directory, under its state dir, noexec; an
		// external bind mount to runc and CRIU, so no checkpoint holds
		// a value.
		es.Mounts = append(es.Mounts, executor.Mount{Source: dir, Target: secrets.Target, Own: true})
	}
	if run.Grants.Network == unit.Egress {
		if run.Spec.Mode == unit.TranscriptMode {
			return es, fmt.Errorf("run %s: %w for a transcript unit: it calls out through its platform", run.ID, ErrNoEgress)
		}
		if h.Links == nil {
			return es, fmt.Errorf("run %s: %w: this host links no sandbox out", run.ID, ErrNoEgress)
		}
		link, err := h.Links.Link(run.ID, run.Grants.Egress, restore)
		if err != nil {
			return es, fmt.Errorf("run %s: %w", run.ID, err)
		}
		es.Link = link
		// A grant naming a destination is resolved by the daemon: the
		// same at every start and restore, here or on another host (the
		// grant is the record's), so a checkpoint's bind mount finds its
		// source again. Without one the unit's image keeps its own file,
		// and its restore no bind mount to make (a CRIU restore pays
		// for each).
		if slices.ContainsFunc(run.Grants.Egress, func(d unit.Dest) bool { return d.Name != "" }) {
			conf, err := h.Links.ResolvConf()
			if err != nil {
				return es, fmt.Errorf("run %s: %w", run.ID, err)
			}
			es.Mounts = append(es.Mounts, executor.Mount{Source: conf, Target: ResolvTarget, Own: true})
		}
	}
	if h.Ranges == nil || !userns {
		return es, nil
	}
	r, err := h.Ranges.Take(run.ID)
	if err != nil {
		return es, err
	}
	es.UserNS = &r
	return es, nil
}
