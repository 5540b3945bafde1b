package member

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
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
// (as an export does) and in the fleet (fleet.Session.Transfer), then adopted
// by to — which fetches it, checks everything an import checks, claims it,
// and resumes it if it was executing here (a parked run stays parked).
// A run still lacking slabs a post-copy migration owes it is refused
// first (store.ErrOwed), nothing changed. Until to has claimed it, a
// failure takes it back here, and a run that was executing is resumed
// here (parked, if that fails); so does a resume to fails while this
// call waits (to hands the run back: Receive); otherwise, after the
// claim, the run is to's whatever this call returns. A drain's
// migrations, and any on a host being drained, leave a run taken back
// parked.
func (m *Member) Migrate(ctx context.Context, id string, to record.Address) error {
	return m.migrate(ctx, id, to, m.stored(id), nil)
}

// placement is a drain's word on a target, judged against its offer just
// before: migrate does not ask the target again (its own check before it
// claims still holds, Config.Fits).
type placement struct {
	postCopy bool // the offer's PostCopy
}

// migrate is Migrate; placed nil, it asks to's offer first (offered).
func (m *Member) migrate(ctx context.Context, id string, to record.Address, hold Hold, placed *placement) error {
	if err := m.moving("migrate", id); err != nil {
		return err
	}
	began := time.Now()
	draining := placed != nil
	// A slot first, the run not held: a park, close or stop of it, and
	// the lease's freeze, do not wait behind the slot's wait.
	sent, err := m.sending.wait(ctx, to)
	if err != nil {
		return fmt.Errorf("migrate %s to %s: %w", id, to, err)
	}
	defer sent()
	h, release, err := hold()
	if err != nil {
		return err
	}
	defer release()
	if err := m.cfg.Store.Owes(id); errors.Is(err, store.ErrStranded) {
		return fmt.Errorf("migrate %s: %w", id, err) // they never come
	} else if err != nil {
		// A post-copy migration still brings its slabs here: handed on,
		// its fill would stop, and the next host owe what none fetches.
		return fmt.Errorf("migrate %s: %w; it moves once they are here", id, err)
	}
	if placed == nil {
		p, err := m.offered(ctx, id, to, h)
		if err != nil {
			return fmt.Errorf("migrate %s to %s: %w", id, to, err)
		}
		placed = &p
	}
	executing := h.Executing()
	if executing {
		m.expected(to, id)
		if err := h.Park(ctx); err != nil {
			return fmt.Errorf("migrate %s: %w", id, err)
		}
	}
	st, err := m.cfg.Store.Run(id)
	if err != nil {
		return err
	}
	genesis := record.Genesis(st.Unit, st.Grants)
	// A migration that parked the unit and then failed, the run still
	// here, resumes it here: what asked for the move finds the unit
	// running where it was. A drain's, or any on a host being drained,
	// leaves it parked, for the host is being emptied; so does one whose
	// post-copy hold for the target could not be dropped (the target may
	// still be served the run's objects).
	holdKept := false
	back := func(err error) error {
		if !executing || draining || m.Draining() || holdKept || m.stillHanded(id) {
			return err
		}
		if rerr := h.Resume(context.WithoutCancel(ctx)); rerr != nil {
			m.cfg.Log.Warn("migration failed, and the run stays parked here: its resume failed", "run", id, "to", to, "err", rerr)
			return fmt.Errorf("%w; the run stays parked here, its resume failed: %v", err, rerr)
		}
		m.cfg.Log.Warn("migration failed: the unit runs here again", "run", id, "to", to, "err", err)
		return fmt.Errorf("%w; the unit runs here again", err)
	}
	made, err := m.handOver(ctx, id, genesis, to)
	if err != nil {
		m.cfg.Metrics.Migrated(true, false, 0)
		return back(fmt.Errorf("migrate %s: %w", id, err))
	}
	// Post-copy only to a target that offered it (an older one refuses
	// Held); one that resumes the run then does so lazily, the slabs
	// still owed fetched as the unit runs.
	err = m.hand(ctx, to, id, Handed{Run: id, Genesis: genesis, Head: st.Head, Resume: executing, Held: placed.postCopy})
	if err != nil {
		m.cfg.Metrics.Migrated(true, false, 0)
		err = m.takeBack(ctx, outbound{id: id, genesis: genesis, head: st.Head, to: to}, made, err)
		if !m.stillHanded(id) {
			// Back here: no target owes it anything.
			if _, derr := m.cfg.Store.DropHold(id, to, st.Head); derr == nil {
				m.serving.end(to, id)
			} else {
				holdKept = true
			}
		}
		m.left(id)
		return back(fmt.Errorf("migrate %s to %s: %w", id, to, err))
	}
	m.left(id)
	m.cfg.Metrics.Migrated(true, true, time.Since(began))
	m.cfg.Log.Info("run migrated", "run", id, "to", to)
	m.cfg.Publish(events.Event{Kind: "run.migrated", Run: id, Detail: to.String()})
	return nil
}

// stillHanded says whether this store holds run id handed off; unknown
// (the store not read), true: what a handed-off run keeps stays.
func (m *Member) stillHanded(id string) bool {
	_, off, err := m.cfg.Store.HandedOff(id)
	return err != nil || off
}

// left tells that run id is another host's (Config.HandedOff) if this
// store holds it handed off: a migration's target claimed it. A store not
// read leaves it to the next start's sweep.
func (m *Member) left(id string) {
	if m.cfg.HandedOff == nil {
		return
	}
	_, off, err := m.cfg.Store.HandedOff(id)
	if err != nil {
		m.cfg.Log.Warn("fleet: whether the run is handed off is unknown; what it holds here stays until the next start", "run", id, "err", err)
		return
	}
	if off {
		m.cfg.HandedOff(id)
	}
}

// hand hands run id over to host to (Peers.Hand), serving it the run's
// record and objects while it takes them (grant), and no longer — unless
// to takes it post-copy (h.Held asks it to, and a run with slabs owed is
// held): then the run is held for to (holdFor, made before the
// hand-over), served until to's Done. A hand-over that failed
// keeps the hold and the grant for migrate to end once the run is back
// here (takeBack): a target that claimed it (the answer lost) may owe
// slabs.
func (m *Member) hand(ctx context.Context, to record.Address, id string, h Handed) error {
	rec, err := m.cfg.Store.Record(id)
	if err != nil {
		return err
	}
	end, err := m.grant(to, id, rec, time.Now())
	if err != nil {
		return err
	}
	held := false
	if h.Held {
		held, err = m.holdFor(id, to, h.Head, rec)
	}
	if err != nil {
		end()
		return err
	}
	h.Held = held
	owing, err := m.cfg.Peers.Hand(ctx, to, h)
	if held && (owing || err != nil) {
		return err
	}
	end()
	if held {
		if _, derr := m.cfg.Store.DropHold(id, to, h.Head); derr != nil {
			m.cfg.Log.Warn("migrate: the run's hold stays (its snapshots are kept) though the target owes nothing", "run", id, "to", to, "err", derr)
		}
	}
	return err
}

// offered asks host to, before anything changes here, whether it could
// take run h (its offer, judged by drain.Fit): a migration it would refuse
// after the transfer is refused now, the unit still running, nothing
// moved; and whether it takes the run post-copy. A run whose need cannot
// be read here is left to the target's own judgement (Config.Fits there),
// and moved whole.
func (m *Member) offered(ctx context.Context, id string, to record.Address, h Held) (placement, error) {
	n, err := h.Need(ctx)
	if err != nil {
		m.cfg.Log.Warn("migrate: the run's needs are not judged before it moves", "run", id, "err", err)
		return placement{}, nil
	}
	octx, cancel := context.WithTimeout(ctx, OfferTimeout)
	defer cancel()
	var images []string
	if n.Image != "" && len(n.Image) <= maxImageName {
		images = []string{n.Image}
	}
	o, err := m.cfg.Peers.Offer(octx, to, images)
	if err != nil {
		return placement{}, err
	}
	return placement{postCopy: o.PostCopy}, drain.Fit(n, o)
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

// outbound is a run this host hands over to another host: its id and
// genesis, the head it is handed over at, and the host it goes to.
type outbound struct {
	id                string
	genesis, head, to record.Address
}

// takeBack undoes a hand-over of o whose adoption failed (cause): in the
// fleet first (refused once o.to has claimed the run: then it is o.to's,
// and stays handed off here, unless o.to handed it back, transferring it
// here: Receive's giveBack; then it is claimed here), then in this store,
// if the hand-over made a handoff there.
func (m *Member) takeBack(ctx context.Context, o outbound, made bool, cause error) error {
	ctx = context.WithoutCancel(ctx)
	s := m.Session()
	if _, err := s.Transfer(ctx, o.genesis, s.Key()); err != nil {
		if e, rerr := s.Run(ctx, o.genesis); rerr != nil || e.To != s.Key() {
			m.cfg.Log.Error("migration failed after the target claimed the run: it is the target's", "run", o.id, "to", o.to, "err", err)
			return errors.Join(cause, err)
		}
		if _, err := s.Claim(ctx, o.genesis, o.id, o.head, record.PhaseParked); err != nil {
			m.cfg.Log.Error("migration failed; the target handed the run back, but it is not claimed here", "run", o.id, "to", o.to, "err", err)
			return errors.Join(cause, err)
		}
	}
	if !made {
		return cause
	}
	if err := m.cfg.Store.Reclaim(o.id, o.head); err != nil {
		return errors.Join(cause, err)
	}
	m.cfg.Log.Warn("migration failed: the run is back here, parked", "run", o.id, "to", o.to, "err", cause)
	return cause
}

// Receive takes the run that host from handed to this host in the fleet
// (h): first the directory must name this host the target of from's
// transfer of the run at h.Head (ErrUnsolicited otherwise, before a byte
// is fetched), and from may have only Config.MaxReceives receives under
// way here (ErrReceiving). Then its record is fetched, and must be the
// run at h.Genesis and h.Head; the objects this store lacks are fetched
// and staged, held to a bundle's limits and the store's minimum free
// space; the run is judged as an import judges a bundle
// ([bundle.ImportStored]) and stored, adopting what was staged, and
// claimed in the fleet. With h.Resume (it was executing there) it is
// resumed here, and handed back to from if that fails (giveBack); else it
// stays parked, as it was. A run refused before it is stored leaves the
// store as it was.
func (m *Member) Receive(ctx context.Context, from record.Address, h Handed) error {
	return m.receive(ctx, from, h, m.fresh(h.Run))
}

// receive is Receive, holding the run by hold (from the import on).
func (m *Member) receive(ctx context.Context, from record.Address, h Handed, hold Hold) error {
	id := h.Run
	if err := m.moving("receive", id); err != nil {
		return err
	}
	if err := m.cfg.Import.CheckID(id); err != nil {
		return err
	}
	if m.Draining() {
		return fmt.Errorf("receive %s: %w: it takes no runs until it restarts", id, ErrDraining)
	}
	max := m.cfg.MaxReceives
	if max <= 0 {
		max = DefaultMaxReceives
	}
	done, ok := m.receiving.take(from, max)
	if !ok {
		return fmt.Errorf("receive %s from %s: %w (%d)", id, from, ErrReceiving, max)
	}
	defer done()
	seen, err := m.solicited(ctx, from, h)
	if err != nil {
		return fmt.Errorf("receive %s from %s: %w", id, from, err)
	}
	arr, rec, err := m.fetch(ctx, from, h)
	if err != nil {
		return fmt.Errorf("receive %s from %s: %w", id, from, err)
	}
	defer arr.Close()
	if o, ok := arr.(interface{ Owed() []transfer.OwedSlab }); ok {
		// Owed from now on: stored, the owing counts them (Reserved).
		var n int64
		for _, s := range o.Owed() {
			n += int64(s.Slab.Size)
		}
		m.arriving.Add(n)
		defer m.arriving.Add(-n)
	}
	m.reach("receive.fetched")
	held, release, err := hold()
	if err != nil {
		return err
	}
	defer release()
	if m.Draining() {
		// A drain began while the run was fetched: it would miss it.
		return fmt.Errorf("receive %s: %w: it takes no runs until it restarts", id, ErrDraining)
	}
	if err := m.importReceived(ctx, id, rec, arr, seen); err != nil {
		m.cfg.Metrics.Migrated(false, false, 0)
		return fmt.Errorf("receive %s from %s: %w", id, from, m.Err(err))
	}
	m.cfg.Metrics.Migrated(false, true, 0)
	m.reach("receive.claimed")
	if err := calls.Fill(m.cfg.Store, id); err != nil {
		m.cfg.Log.Warn("call ledger: the received run's calls are listed without their payloads until the next start", "run", id, "err", err)
	}
	owing, err := m.Owing(id)
	if err != nil {
		m.cfg.Log.Warn("post-copy: whether the received run owes slabs is unknown; the next start brings them in", "run", id, "err", err)
	}
	m.cfg.Log.Info("run received", "run", id, "from", from, "resume", h.Resume, "post-copy", owing)
	if owing {
		m.reach("receive.owing")
		m.payLater(id)
	}
	if !h.Resume {
		return nil
	}
	if err := held.Resume(ctx); err != nil {
		return m.giveBack(ctx, from, id, rec, err)
	}
	return nil
}

// giveBack hands run id, received from host from and claimed here, whose
// resume failed (cause: an image refused, a restore that failed) back to
// from while from still waits for the answer: transferred to it in the
// fleet, then handed off in this store, as a migration's source does, so
// that from's take-back claims it, parked at the head it handed over
// (Migrate). A run the resume left elsewhere than that head, parked, or
// whose source no longer waits (ctx done: its take-back is over), stays
// here, this host's; so does one either step fails for, and the error
// says both. A crash between the two steps leaves the transfer, which
// this host's next start takes back unless from claimed the run first.
func (m *Member) giveBack(ctx context.Context, from record.Address, id string, rec *record.Record, cause error) error {
	if ctx.Err() != nil {
		return cause
	}
	if st, err := m.cfg.Store.Run(id); err != nil || st.Head != rec.Head() || st.Phase != record.PhaseParked {
		return cause
	}
	ctx = context.WithoutCancel(ctx)
	if _, err := m.Session().Transfer(ctx, rec.Genesis(), from); err != nil {
		return errors.Join(cause, err)
	}
	if err := m.cfg.Store.HandOff(id, rec.Head()); err != nil {
		return errors.Join(cause, err)
	}
	m.left(id)
	m.cfg.Log.Warn("receive: the resume failed; the run is handed back to its source, parked", "run", id, "to", from, "err", cause)
	return cause
}

// fetch brings the run's record from host from, which must be the run the
// directory's entry names (h.Genesis, at h.Head, parked), then stages the
// objects it reaches that this store lacks.
func (m *Member) fetch(ctx context.Context, from record.Address, h Handed) (Arrival, *record.Record, error) {
	lim := m.cfg.Import.Limits.Or(bundle.DefaultLimits)
	judge := func(rec *record.Record) error {
		if rec.Genesis() != h.Genesis || rec.Head() != h.Head || rec.Phase() != record.PhaseParked {
			return fmt.Errorf("%w: the record sent is run %s at %s (%s), the transfer names %s at %s",
				ErrUnsolicited, rec.Genesis(), rec.Head(), rec.Phase(), h.Genesis, h.Head)
		}
		return nil
	}
	opt := FetchOptions{Store: m.cfg.Store, Limits: lim, Free: m.free, Owe: m.cfg.PostCopy && h.Held,
		Rehashed: m.expect.rehashed(ctx, h.Genesis)}
	rec, arr, err := m.cfg.Peers.Fetch(ctx, from, h.Run, judge, opt)
	if err != nil {
		return nil, nil, err
	}
	return arr, rec, nil
}

// importReceived stores the fetched run, judged as an import judges a
// bundle over the staged objects (arr), then claims it in the fleet.
// Stored first: a parked run this host does not own is inert here (the
// fence refuses its every advance), and a crash between the two leaves it
// stored and transferred here, which the next start claims
// (fleet.Reconcile: Reclaim); the other order would leave this host owning
// a run it does not hold. A run this host could not resume now
// (Config.Fits: its recorded manifest against this host) is not claimed,
// and neither is one the source took back meanwhile: either is left here
// handed off, and the source takes the run back. The claim is judged
// first on the directory as the receive saw it (seen), in one request
// when nothing changed since.
func (m *Member) importReceived(ctx context.Context, id string, rec *record.Record, arr Arrival, seen fleet.Seen) error {
	o := m.cfg.Import
	o.ID = id
	_, err := bundle.ImportStored(ctx, arr, rec, bundle.StoredOptions{Run: id, ImportOptions: o})
	if err != nil {
		return err
	}
	m.reach("receive.imported")
	err = nil
	if m.cfg.Fits != nil {
		err = m.cfg.Fits(ctx, id)
	}
	if err == nil {
		_, err = m.Session().ClaimSeen(ctx, seen, id, rec.Head(), rec.Phase())
	}
	if err != nil {
		if herr := m.cfg.Store.HandOff(id, rec.Head()); herr != nil {
			err = errors.Join(err, herr)
		} else if aerr := m.cfg.Store.Abandon(id); aerr != nil {
			err = errors.Join(err, aerr)
		}
		return err
	}
	return nil
}
