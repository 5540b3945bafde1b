package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Peers are the fleet's other hosts as a migration uses them: internal/
// server reaches them on their mutual-TLS listeners (internal/peer), at
// the address their session gives (fleet.Member.Peer), pinned to their key.
type Peers interface {
	// Hand asks host to take run from this host: the run is handed to it
	// in the fleet, and it fetches, imports and claims it, and resumes it
	// when resume (the run was executing here).
	Hand(ctx context.Context, host record.Address, run string, resume bool) error
	// Fetch brings run's record from host, and every object the record
	// reaches that st lacks, each verified by its address.
	Fetch(ctx context.Context, host record.Address, run string, st *store.Store, limits bundle.Limits) (*record.Record, error)
	// Offer asks host what it can take now (its Daemon.Offer), naming the
	// images the runs to place need.
	Offer(ctx context.Context, host record.Address, images []string) (drain.Offer, error)
}

// ErrNoFleet is a migration asked of a host that is not in a fleet.
var ErrNoFleet = errors.New("this host is not in a fleet")

// Migrate moves run id to host to, in the fleet (docs/fleet.md,
// "Migration"): parked here if it is executing, handed off in this store
// (as an export does) and in the fleet (fleet.Host.Transfer), then adopted
// by to — which fetches it, checks everything an import checks, claims it,
// and resumes it if it was executing here (a parked run stays parked). Until
// to has claimed it, a failure takes it back here, parked and resumable;
// after, the run is to's whatever this call returns.
func (d *Daemon) Migrate(ctx context.Context, id string, to record.Address) (Summary, error) {
	if d.session() == nil || d.cfg.Peers == nil {
		return Summary{}, fmt.Errorf("migrate %s: %w", id, ErrNoFleet)
	}
	began := time.Now()
	r, err := d.lockRun(id)
	if err != nil {
		return Summary{}, err
	}
	defer r.mu.Unlock()
	executing := r.live != nil
	if executing {
		if _, err := d.park(ctx, id, r); err != nil {
			return Summary{}, fmt.Errorf("migrate %s: %w", id, err)
		}
	}
	st, err := d.st.Run(id)
	if err != nil {
		return Summary{}, err
	}
	genesis := record.Genesis(st.Unit, st.Grants)
	made, err := d.handOver(ctx, id, genesis, to)
	if err != nil {
		d.metrics.Migrated(true, false, 0)
		return Summary{}, fmt.Errorf("migrate %s: %w", id, err)
	}
	d.reach("migrate.transferred")
	if err := d.cfg.Peers.Hand(ctx, to, id, executing); err != nil {
		d.metrics.Migrated(true, false, 0)
		return Summary{}, fmt.Errorf("migrate %s to %s: %w", id, to, d.takeBack(ctx, id, genesis, st.Head, to, made, err))
	}
	d.metrics.Migrated(true, true, time.Since(began))
	d.log.Info("run migrated", "run", id, "to", to)
	d.publish(events.Event{Kind: "run.migrated", Run: id, Detail: to.String()})
	return d.summary(id, r)
}

// handOver hands parked run id to host to: in the fleet first (only to may
// claim it; a crash after this leaves the transfer, which marks a
// migration in flight, for the next start to take back), then in this
// store (this host resumes and closes it no more). It reports whether it
// made the store's handoff (an earlier export may have): only a handoff
// made here is taken back here.
func (d *Daemon) handOver(ctx context.Context, id string, genesis, to record.Address) (made bool, err error) {
	if err := d.Exportable(id); err != nil {
		return false, err
	}
	if _, err := d.session().Transfer(ctx, genesis, to); err != nil {
		return false, d.fleetErr(err)
	}
	d.reach("migrate.transferred")
	_, made, err = bundle.Prepare(d.st, id, true)
	if err != nil {
		if _, terr := d.session().Transfer(context.WithoutCancel(ctx), genesis, d.session().Key()); terr != nil {
			err = errors.Join(err, terr)
		}
		return false, err
	}
	d.reach("migrate.handedoff")
	return made, nil
}

// takeBack undoes a hand-over whose adoption failed: in the fleet first
// (refused once to has claimed the run: then it is to's, and stays handed
// off here), then in this store.
func (d *Daemon) takeBack(ctx context.Context, id string, genesis, head, to record.Address, made bool, cause error) error {
	if _, err := d.session().Transfer(context.WithoutCancel(ctx), genesis, d.session().Key()); err != nil {
		d.log.Error("migration failed after the target claimed the run: it is the target's", "run", id, "to", to, "err", err)
		return errors.Join(cause, err)
	}
	if !made {
		return cause
	}
	if err := d.st.Reclaim(id, head); err != nil {
		return errors.Join(cause, err)
	}
	d.log.Warn("migration failed: the run is back here, parked", "run", id, "to", to, "err", cause)
	return cause
}

// Receive takes run id from host from, which handed it to this host in
// the fleet: its record and the objects this store lacks are fetched, the
// run is judged as an import judges a bundle ([bundle.ImportStored]),
// claimed in the fleet and stored; with resume (it was executing there) it
// is resumed here, else it stays parked, as it was.
func (d *Daemon) Receive(ctx context.Context, from record.Address, id string, resume bool) (Summary, error) {
	if d.session() == nil || d.cfg.Peers == nil {
		return Summary{}, fmt.Errorf("receive %s: %w", id, ErrNoFleet)
	}
	if err := checkID(id); err != nil {
		return Summary{}, err
	}
	if d.draining.Load() {
		return Summary{}, fmt.Errorf("receive %s: %w: it takes no runs until it restarts", id, ErrDraining)
	}
	rec, err := d.cfg.Peers.Fetch(ctx, from, id, d.st, d.cfg.BundleLimits)
	if err != nil {
		return Summary{}, fmt.Errorf("receive %s from %s: %w", id, from, err)
	}
	d.reach("receive.fetched")
	r := d.lock(id)
	defer r.mu.Unlock()
	if err := d.importReceived(ctx, from, id, rec); err != nil {
		d.metrics.Migrated(false, false, 0)
		return Summary{}, fmt.Errorf("receive %s from %s: %w", id, from, d.fleetErr(err))
	}
	d.metrics.Migrated(false, true, 0)
	d.reach("receive.claimed")
	d.fillCalls(id)
	d.log.Info("run received", "run", id, "from", from, "resume", resume)
	if resume {
		res, err := d.resume(ctx, id, r)
		return res.Run, err
	}
	return d.summary(id, r)
}

// importReceived stores the fetched run, judged as an import judges a
// bundle, then claims it in the fleet. Stored first: a parked run this host
// does not own is inert here (the fence refuses its every advance), and a
// crash between the two leaves it stored and transferred here, which the
// next start claims (fleet.Reconcile: Reclaim); the other order would leave
// this host owning a run it does not hold. A claim refused (the source took
// the run back meanwhile) leaves the run here handed off. The fleet's
// admitted hosts are trusted signers here (Daemon.trusted).
func (d *Daemon) importReceived(ctx context.Context, from record.Address, id string, rec *record.Record) error {
	_, err := bundle.ImportStored(ctx, d.st, rec, bundle.StoredOptions{Run: id, ImportOptions: bundle.ImportOptions{
		Options: bundle.Options{Limits: d.cfg.BundleLimits, Trusted: d.trusted, Policy: bundle.HostPolicy(d.cfg.BundleMounts, d.cfg.StateDir)},
		ID:      id, CheckID: checkID}})
	if err != nil {
		return err
	}
	d.reach("receive.imported")
	if _, err := d.session().Claim(ctx, rec.Genesis(), id, rec.Head(), rec.Phase()); err != nil {
		if herr := d.st.HandOff(id, rec.Head()); herr != nil {
			err = errors.Join(err, herr)
		}
		return err
	}
	return nil
}
