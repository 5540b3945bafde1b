package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Resume resumes a parked run on this host after the three preconditions,
// in order: the snapshot the store offers is the one recorded, this host
// satisfies the recorded manifest key by key (manifest.Judge), and the
// record verifies from genesis. A refusal changes nothing. A run whose
// grant set names secrets needs their values here: secrets, when given,
// are all of them and replace what this host holds; without them the
// host must hold each (secretsFor).
func (d *Daemon) Resume(ctx context.Context, id string, secrets map[string]string) (answers.Resumed, error) {
	r, err := d.runs.lockRun(id)
	if err != nil {
		return answers.Resumed{}, err
	}
	defer r.mu.Unlock()
	return d.resume(ctx, id, r, secrets)
}

func (d *Daemon) resume(ctx context.Context, id string, r *run, secrets map[string]string) (answers.Resumed, error) {
	if d.stopping.Load() {
		return answers.Resumed{}, fmt.Errorf("resume %s: %w", id, answers.ErrStopping)
	}
	lent, err := lend(ctx, d.forms, d.fleet, id)
	if err != nil {
		// A post-copy migration's slabs are not all here, and its
		// source cannot serve them now.
		return answers.Resumed{}, fmt.Errorf("resume %s: %w", id, err)
	}
	lending := lent != nil
	defer func() {
		if lending {
			lent.Close()
		}
	}()
	var borrowed park.Owed // a nil *member.Lent is not a nil park.Owed
	if lent != nil {
		borrowed = lent
	}
	clock := answers.NewClock()
	ok, err := d.judgeResume(ctx, id, clock, borrowed)
	if err != nil {
		return answers.Resumed{}, err
	}
	defer ok.Forget()
	if err := secretsFor(d.secrets, id, ok.Grants.Secrets, secrets); err != nil {
		return answers.Resumed{}, err
	}
	// The idle energy the park owes ends where the restore begins; in a
	// fleet the Resumed segment that records it is reserved before any
	// unit runs (docs/fleet.md).
	// A warm sandbox is taken only now, the resume admitted; what the
	// pool held for the run is its warm-pool residency, owed with the
	// park's (docs/warm-pool.md).
	waking := ok.Waking(r.teardown)
	var residency idle.Residency
	waking.Warm, residency = d.forms.TakeWarm(id, ok.Spec.Mode)
	owed, prov := idle.OwedWith(r.park, ok.Retained, ok.ParkedFor, d.meter.Coefficients(), residency)
	res, err := d.fleet.Reserve(ctx, id, record.Resumption(ok.Suspended.Snapshot, owed.UJ, prov))
	if err != nil {
		if waking.Warm != nil {
			_ = waking.Warm.Discard(context.WithoutCancel(ctx))
		}
		return answers.Resumed{}, fmt.Errorf("resume %s: %w", id, err)
	}
	w, err := d.forms.For(ok.Spec.Mode).Wake(ctx, ok.Run, waking)
	if err != nil {
		res.Cancel(ctx)
		return answers.Resumed{}, err
	}
	if done := w.Unit.PagesDone(); lending && done != nil {
		// Lent until the page server is done with the owed slabs: every
		// page is in, or the pages are lost (or the daemon stops).
		lending = false
		d.bg.Go(func() {
			select {
			case <-done:
			case <-d.bgCtx.Done():
			}
			lent.Close()
		})
	}
	lv := d.intervals.begin(id, w.Unit, w.Event, w.Mark)
	clock.Mark("sandbox")
	lv.iv.Journal(attest.LifecycleOf(nowNS(), owed))
	lv.iv.Journal(attest.LifecyclesOf(nowNS(), w.Details)...)
	linked := d.links != nil && ok.Grants.Network == unit.Egress
	if linked {
		// The connections to outside its pass closes are journaled, and
		// the mark saved, before any is closed (docs/unit.md, egress).
		err := d.links.Closing(id, func(e attest.Entry) error {
			lv.iv.Journal(e)
			return lv.iv.Save()
		})
		if err != nil {
			d.log.Error("the resumed unit's connections to outside not closed", "run", id, "err", err)
		}
	}
	// Saved before the append: a daemon restarted after it attests the
	// interval from its start. (A crash before the append leaves a mark
	// the next resume overwrites.)
	d.intervals.SaveMark(lv.iv)
	d.reach("resume.restored")
	if err := res.Append(ctx); err != nil {
		d.intervals.DropMark(id)
		lv.stopping = true
		lv.destroy(d.log)
		return answers.Resumed{}, fmt.Errorf("resume %s: %w", id, err)
	}
	clock.Mark("append")
	d.reach("resume.appended")
	if linked {
		// Not passed, the outside's packets stay dropped (its
		// connections wait, none is closed): the unit runs on, logged.
		if err := d.links.Pass(id); err != nil {
			d.log.Error("the resumed unit's link out not passed, or its connections to outside not all closed", "run", id, "err", err)
		}
	}
	r.live, r.park = lv, nil
	d.watch(id, r, lv)
	d.watchPages(id, r, lv, ok.Suspended.Snapshot)
	d.metrics.Resumed(clock.Total(), owed.UJ, prov)
	if ok.Spec.Mode == unit.TranscriptMode && d.forms.Warm != nil {
		d.metrics.WarmResumed(w.Warm)
	}
	sum, err := d.runs.summary(id, r)
	if err != nil {
		return answers.Resumed{}, err
	}
	detail := fmt.Sprintf("idle %d uJ %s", owed.UJ, prov)
	if w.Warm {
		detail += " warm"
	}
	d.events.Publish(events.Event{Kind: "run.resumed", Run: id, Detail: detail})
	lv.unit.Serve(d.bg.Go)
	d.log.Info("run resumed", "run", id, "idle_uj", owed.UJ, "provenance", prov, "warm", w.Warm, "took", clock.Total())
	return answers.Resumed{Run: sum, Idle: owed, Restore: w.Restored, Took: clock.Total(), Steps: clock.Steps}, nil
}

// judgeResume admits parked run id for a resume, changing nothing: it is
// parked and held here, and passes the three preconditions, in order
// (forms.Env.Admit).
func (d *Daemon) judgeResume(ctx context.Context, id string, clock *answers.Clock, owed park.Owed) (forms.Admitted, error) {
	st, err := d.st.Run(id)
	if err != nil {
		return forms.Admitted{}, err
	}
	if err := phaseErr(id, st.Phase, record.PhaseParked); err != nil {
		return forms.Admitted{}, err
	}
	if err := bundle.HeldHere(d.st, id); err != nil {
		return forms.Admitted{}, err
	}
	return d.forms.Admit(ctx, st, clock.Mark, owed)
}

// lend makes sure parked run id's resume has the slabs a post-copy
// migration still owes it, if any (docs/fleet.md, "Post-copy"): on a host
// whose forms f serve lazy restores they are lent to it (member.Lend),
// each chunk fetched before it is served; elsewhere the resume waits for
// them all (member.Pay). Close what it returns.
func lend(ctx context.Context, f forms.Env, m *member.Member, id string) (*member.Lent, error) {
	if f.Lazy != nil && f.LazyServed {
		return m.Lend(ctx, id)
	}
	return nil, m.Pay(ctx, id)
}

// watchPages follows a lazily restored unit's memory (docs/lazy-resume.md,
// internal/forms). Every page resident, the interval's journal says when.
// Pages lost, the unit (frozen by its form, its missing pages never read)
// ends its interval, journaled as pages-lost, in a park back at snap, the
// snapshot it resumed from, verified before its first page was served:
// the run is parked again, and its next resume restores snap anew.
func (d *Daemon) watchPages(id string, r *run, lv *live, snap record.Snapshot) {
	done := lv.unit.PagesDone()
	if done == nil {
		return
	}
	d.bg.Go(func() {
		select {
		case <-done:
		case <-d.bgCtx.Done():
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.live != lv || lv.stopping {
			return
		}
		if !lv.unit.PagesLost() {
			d.reach("lazy.resident")
		}
		lost := lv.unit.JournalPages(lv.iv)
		if lost == nil {
			d.intervals.SaveMark(lv.iv)
			d.events.Publish(events.Event{Kind: "run.resident", Run: id})
			return
		}
		d.parkBack(id, r, lv, snap, loss{err: lost, event: eventPagesLost})
	})
}

// parkBack ends lv's interval, whose unit's memory was lost (its journal
// says how already, l.how), as a park back at snap, the snapshot the run
// resumed from, and tears the sandbox down, publishing l.event if any. The
// caller holds r's lock and has frozen the unit. An append refused leaves the unit
// frozen in a new interval (park-refused) that a close ends.
func (d *Daemon) parkBack(id string, r *run, lv *live, snap record.Snapshot, l loss) bool {
	st, err := d.st.Run(id)
	if err == nil {
		_, _, err = d.recordTaken(context.Background(), lv, taking{Taken: forms.Taken{Snapshot: snap, Keys: manifest.ImageKeys}, unitID: st.Unit, account: lv.unit.Account()})
	}
	if err != nil {
		if lv.iv.Ended() { // the unit stays frozen, in a new interval a close ends
			d.intervals.restart(id, lv, attest.EventParkRefused)
		}
		d.log.Error("parking a run back at the snapshot it resumed from", "run", id, "lost", l.err, "err", err)
		return false
	}
	d.tearDownParked(r, lv)
	d.log.Warn("run parked back at the snapshot it resumed from", "run", id, "lost", l.err)
	if l.event != "" {
		d.events.Publish(events.Event{Kind: l.event, Run: id, Detail: snap.String()})
	}
	return true
}

// eventPagesLost is the event a park back for lost pages publishes.
const eventPagesLost = "run.pages-lost"

// loss is how a unit's memory was lost, for its park back: the journal's
// entry (pages-lost, unit-lost), the error logged, the event published
// (if any; at a start no watcher is connected yet).
type loss struct {
	how   attest.Detail
	err   error
	event string
}

// unfinishedLoss is how a run a restarted daemon found executing, whose
// lazy restore no daemon saw finish (forms.Env.LazyUnfinished), lost its
// pages; its interval's journal so far is es.
func unfinishedLoss(es []attest.Entry) loss {
	return loss{
		how:   attest.PagesLost{AfterNS: restoreAge(es, time.Now()), Reason: forms.RestartedReason},
		err:   fmt.Errorf("%w: %s", pageserver.ErrPagesLost, forms.RestartedReason),
		event: eventPagesLost,
	}
}

// parkBackResumed parks back a run a restarted daemon found executing
// whose unit's memory is not the recorded one: the unit is frozen (found
// so, stopped or gone, or now; destroyed where the freeze fails within
// unfinishedFreeze), its interval journals l.how, and it ends
// as a park back at the snapshot the run resumed from (parkBack). It
// reports whether the run's record names such a snapshot (the last
// Suspended segment before its Resumed one; without it nothing is done),
// and whether the park back was recorded. The caller holds r's lock.
func (d *Daemon) parkBackResumed(id string, r *run, lv *live, l loss) (named, parked bool) {
	raw, err := d.st.Raw(id)
	if err != nil {
		d.log.Error("reconcile: reading the record of a run to park back", "run", id, "err", err)
		return false, false
	}
	segs := raw.Segments
	if len(segs) < 2 || segs[len(segs)-1].Kind != record.Resumed || segs[len(segs)-2].Kind != record.Suspended {
		return false, false
	}
	snap := segs[len(segs)-2].Snapshot
	ctx, cancel := context.WithTimeout(context.Background(), unfinishedFreeze)
	defer cancel()
	var perr error
	if st, _ := lv.sb.Status(ctx); st != "paused" && st != "stopped" {
		perr = lv.sb.Pause(ctx)
	}
	if perr != nil {
		// A thread waiting on a page no lazy-pages will serve may not
		// freeze (a futex on it waits killable, not freezable): the
		// unit is destroyed at once rather than hold the start up.
		if derr := lv.sb.Destroy(context.WithoutCancel(ctx)); derr != nil {
			perr = errors.Join(perr, derr)
		}
		l.err = fmt.Errorf("%w (freeze: %v)", l.err, perr)
	}
	lv.iv.Journal(attest.LifecycleOf(time.Now().UnixNano(), l.how))
	return true, d.parkBack(id, r, lv, snap, l)
}

// unfinishedFreeze bounds the freeze of a unit whose lazy restore a
// restarted daemon found unfinished (unfinishedLoss): a freeze takes
// milliseconds, and the start waits for it.
const unfinishedFreeze = 5 * time.Second

// restoreAge is how long before now the restore that began the interval
// whose journal so far is es started, 0 without one.
func restoreAge(es []attest.Entry, now time.Time) int64 {
	if start, _, ok := restoreStart(es); ok {
		return now.UnixNano() - start
	}
	return 0
}

// restoreStart is when the restore that began the interval whose journal
// so far is es started (its restored entry's time less its total), in
// Unix nanoseconds, and the entry's detail; ok false without one.
func restoreStart(es []attest.Entry) (ns int64, rs attest.Restored, ok bool) {
	j := attest.Journal{Entries: es}
	if !j.Find(&rs) {
		return 0, rs, false
	}
	for _, e := range es {
		if e.Kind == attest.Lifecycle && bytes.HasPrefix(e.Data, []byte(attest.EventRestored+" ")) {
			return e.AtNS - rs.TotalNS, rs, true
		}
	}
	return 0, rs, false
}

// journalSettled journals, in a reattached interval whose journal so far
// is iv's, the resident entry of its lazy restore that the daemon that
// saw every page in (at at) died before journaling: none when the
// interval's restore was not lazy, or its journal says what became of its
// pages already.
func journalSettled(iv *interval.Interval, at time.Time) {
	es := iv.Events()
	start, rs, ok := restoreStart(es)
	j := attest.Journal{Entries: es}
	if !ok || !rs.Lazy || j.Find(&attest.Resident{}) || j.Find(&attest.PagesLost{}) || at.UnixNano() <= start {
		return // (a clock stepped back: no time to say)
	}
	iv.Journal(attest.LifecycleOf(at.UnixNano(), attest.Resident{NS: at.UnixNano() - start}))
}

// OpenJournal is the journal so far of run id's open interval on this
// host (its lifecycle entries: show reads a lazy restore's times there),
// nil when it has none or an operation holds the run.
func (d *Daemon) OpenJournal(id string) *attest.Journal {
	r := d.runs.peek(id)
	if r == nil || !r.mu.TryLock() {
		return nil
	}
	defer r.mu.Unlock()
	if r.live == nil {
		return nil
	}
	return &attest.Journal{Entries: slices.Clone(r.live.iv.Events())}
}
