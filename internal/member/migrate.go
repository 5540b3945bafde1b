package member

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// ErrDraining refuses a new run, or a run moved here, on a host being
// drained.
var ErrDraining = errors.New("this host is being drained")

// Hold holds a run for one operation (the daemon's run lock), until
// release; a run that must be stored and is not is an error.
type Hold func() (h Held, release func(), err error)

// Migrate moves run id to host to, in the fleet (docs/fleet.md,
// "Migration"): parked here if it is executing, handed off in this store
// (as an export does) and in the fleet (fleet.Host.Transfer), then adopted
// by to — which fetches it, checks everything an import checks, claims it,
// and resumes it if it was executing here (a parked run stays parked).
// Until to has claimed it, a failure takes it back here, parked and
// resumable; after, the run is to's whatever this call returns.
func (m *Member) Migrate(ctx context.Context, id string, to record.Address) error {
	return m.migrate(ctx, id, to, m.stored(id), true)
}

// MigratePlaced is Migrate for a run a drain's placement has just judged
// against to's offer: to is not asked again before the run moves (its own
// check before it claims still holds, Config.Fits).
func (m *Member) MigratePlaced(ctx context.Context, id string, to record.Address) error {
	return m.migrate(ctx, id, to, m.stored(id), false)
}

func (m *Member) migrate(ctx context.Context, id string, to record.Address, hold Hold, ask bool) error {
	if err := m.moving("migrate", id); err != nil {
		return err
	}
	began := time.Now()
	h, release, err := hold()
	if err != nil {
		return err
	}
	defer release()
	if ask {
		if err := m.offered(ctx, id, to, h); err != nil {
			return fmt.Errorf("migrate %s to %s: %w", id, to, err)
		}
	}
	executing := h.Executing()
	if executing {
		if err := h.Park(ctx); err != nil {
			return fmt.Errorf("migrate %s: %w", id, err)
		}
	}
	st, err := m.cfg.Store.Run(id)
	if err != nil {
		return err
	}
	genesis := record.Genesis(st.Unit, st.Grants)
	made, err := m.handOver(ctx, id, genesis, to)
	if err != nil {
		m.cfg.Metrics.Migrated(true, false, 0)
		return fmt.Errorf("migrate %s: %w", id, err)
	}
	if err := m.cfg.Peers.Hand(ctx, to, id, executing); err != nil {
		m.cfg.Metrics.Migrated(true, false, 0)
		return fmt.Errorf("migrate %s to %s: %w", id, to, m.takeBack(ctx, id, genesis, st.Head, to, made, err))
	}
	m.cfg.Metrics.Migrated(true, true, time.Since(began))
	m.cfg.Log.Info("run migrated", "run", id, "to", to)
	m.cfg.Publish(events.Event{Kind: "run.migrated", Run: id, Detail: to.String()})
	return nil
}

// offered asks host to, before anything changes here, whether it could
// take run h (its offer, judged by drain.Fit): a migration it would refuse
// after the transfer is refused now, the unit still running, nothing
// moved. A run whose need cannot be read here is left to the target's own
// judgement (Config.Fits there).
func (m *Member) offered(ctx context.Context, id string, to record.Address, h Held) error {
	n, err := h.Need(ctx)
	if err != nil {
		m.cfg.Log.Warn("migrate: the run's needs are not judged before it moves", "run", id, "err", err)
		return nil
	}
	octx, cancel := context.WithTimeout(ctx, OfferTimeout)
	defer cancel()
	var images []string
	if n.Image != "" && len(n.Image) <= maxImageName {
		images = []string{n.Image}
	}
	o, err := m.cfg.Peers.Offer(octx, to, images)
	if err != nil {
		return err
	}
	return drain.Fit(n, o)
}

// handOver hands parked run id to host to: in the fleet first (only to may
// claim it; a crash after this leaves the transfer, which marks a
// migration in flight, for the next start to take back), then in this
// store (this host resumes and closes it no more). It reports whether it
// made the store's handoff (an earlier export may have): only a handoff
// made here is taken back here.
func (m *Member) handOver(ctx context.Context, id string, genesis, to record.Address) (made bool, err error) {
	if err := m.cfg.Exportable(id); err != nil {
		return false, err
	}
	if _, err := m.Session().Transfer(ctx, genesis, to); err != nil {
		return false, m.Err(err)
	}
	m.reach("migrate.transferred")
	_, made, err = bundle.Prepare(m.cfg.Store, id, true)
	if err != nil {
		if _, terr := m.Session().Transfer(context.WithoutCancel(ctx), genesis, m.Session().Key()); terr != nil {
			err = errors.Join(err, terr)
		}
		return false, err
	}
	m.reach("migrate.handedoff")
	return made, nil
}

// takeBack undoes a hand-over whose adoption failed: in the fleet first
// (refused once to has claimed the run: then it is to's, and stays handed
// off here), then in this store.
func (m *Member) takeBack(ctx context.Context, id string, genesis, head, to record.Address, made bool, cause error) error {
	if _, err := m.Session().Transfer(context.WithoutCancel(ctx), genesis, m.Session().Key()); err != nil {
		m.cfg.Log.Error("migration failed after the target claimed the run: it is the target's", "run", id, "to", to, "err", err)
		return errors.Join(cause, err)
	}
	if !made {
		return cause
	}
	if err := m.cfg.Store.Reclaim(id, head); err != nil {
		return errors.Join(cause, err)
	}
	m.cfg.Log.Warn("migration failed: the run is back here, parked", "run", id, "to", to, "err", cause)
	return cause
}

// Receive takes run id from host from, which handed it to this host in
// the fleet: its record and the objects this store lacks are fetched, the
// run is judged as an import judges a bundle ([bundle.ImportStored]),
// claimed in the fleet and stored; with resume (it was executing there) it
// is resumed here, else it stays parked, as it was. hold holds the run
// (not yet stored) from the import on.
func (m *Member) Receive(ctx context.Context, from record.Address, id string, resume bool) error {
	return m.receive(ctx, from, id, resume, m.fresh(id))
}

// receive is Receive, holding the run by hold.
func (m *Member) receive(ctx context.Context, from record.Address, id string, resume bool, hold Hold) error {
	if err := m.moving("receive", id); err != nil {
		return err
	}
	if err := m.cfg.Import.CheckID(id); err != nil {
		return err
	}
	if m.Draining() {
		return fmt.Errorf("receive %s: %w: it takes no runs until it restarts", id, ErrDraining)
	}
	rec, err := m.cfg.Peers.Fetch(ctx, from, id, m.cfg.Store, m.cfg.Import.Limits)
	if err != nil {
		return fmt.Errorf("receive %s from %s: %w", id, from, err)
	}
	m.reach("receive.fetched")
	h, release, err := hold()
	if err != nil {
		return err
	}
	defer release()
	if m.Draining() {
		// A drain began while the run was fetched: it would miss it.
		return fmt.Errorf("receive %s: %w: it takes no runs until it restarts", id, ErrDraining)
	}
	if err := m.importReceived(ctx, id, rec); err != nil {
		m.cfg.Metrics.Migrated(false, false, 0)
		return fmt.Errorf("receive %s from %s: %w", id, from, m.Err(err))
	}
	m.cfg.Metrics.Migrated(false, true, 0)
	m.reach("receive.claimed")
	if err := calls.Fill(m.cfg.Store, id); err != nil {
		m.cfg.Log.Warn("call ledger: the received run's calls are listed without their payloads until the next start", "run", id, "err", err)
	}
	m.cfg.Log.Info("run received", "run", id, "from", from, "resume", resume)
	if resume {
		return h.Resume(ctx)
	}
	return nil
}

// importReceived stores the fetched run, judged as an import judges a
// bundle, then claims it in the fleet. Stored first: a parked run this host
// does not own is inert here (the fence refuses its every advance), and a
// crash between the two leaves it stored and transferred here, which the
// next start claims (fleet.Reconcile: Reclaim); the other order would leave
// this host owning a run it does not hold. A run this host could not
// resume now (Config.Fits: its recorded manifest against this host) is not
// claimed, and neither is one the source took back meanwhile: either is
// left here handed off, and the source takes the run back.
func (m *Member) importReceived(ctx context.Context, id string, rec *record.Record) error {
	o := m.cfg.Import
	o.ID = id
	_, err := bundle.ImportStored(ctx, m.cfg.Store, rec, bundle.StoredOptions{Run: id, ImportOptions: o})
	if err != nil {
		return err
	}
	m.reach("receive.imported")
	err = nil
	if m.cfg.Fits != nil {
		err = m.cfg.Fits(ctx, id)
	}
	if err == nil {
		_, err = m.Session().Claim(ctx, rec.Genesis(), id, rec.Head(), rec.Phase())
	}
	if err != nil {
		if herr := m.cfg.Store.HandOff(id, rec.Head()); herr != nil {
			err = errors.Join(err, herr)
		}
		return err
	}
	return nil
}
