package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Close closes a run, in any phase: a running unit's interval is recorded
// (outcome killed) with the Closed segment, and then its sandbox destroyed.
func (d *Daemon) Close(ctx context.Context, id, reason string) (answers.Summary, error) {
	if reason == "" {
		reason = "closed by request"
	}
	r, err := d.runs.lockRun(id)
	if err != nil {
		return answers.Summary{}, err
	}
	defer r.mu.Unlock()
	st, err := d.st.Run(id)
	if err != nil {
		return answers.Summary{}, err
	}
	if st.Phase == record.PhaseClosed {
		return answers.Summary{}, fmt.Errorf("run %s: %w", id, record.ErrClosed)
	}
	if err := bundle.HeldHere(d.st, id); err != nil {
		return answers.Summary{}, err
	}
	closed := record.Closure(reason)
	lv := r.live
	if lv != nil {
		// As a park does: nothing reaches the account between its
		// sealing and the close.
		defer lv.unit.Hold()()
		_, err = d.intervals.end(ctx, lv, "close.sealed", interval.Ending{Outcome: attest.Outcome{Kind: attest.Killed}, Calls: lv.unit.Account(), Then: []record.Segment{closed}})
	} else {
		err = d.fleet.Append(id, closed)
	}
	if err != nil {
		if lv != nil && lv.iv.Ended() {
			d.intervals.restart(id, lv, attest.EventCloseRefused)
		}
		return answers.Summary{}, fmt.Errorf("close %s: %w", id, err)
	}
	d.reach("close.appended")
	// A post-copy owing ends now, a stranded one too (no fetch tries it
	// again); a crash first leaves it to the next start's fetch.
	d.fleet.Closed(id)
	d.forms.Warm.Discard(ctx, id, true)
	d.intervals.DropMark(id)
	if lv != nil {
		lv.stopping = true
		lv.destroy(d.log)
	}
	if r.teardown != nil {
		<-r.teardown
	}
	// Whatever else of the run this host still has goes too: the sandbox
	// of a run that was lost (its unit may be alive), or one a park left.
	forms.RemoveRun(ctx, d.ex, id, d.log)
	if d.base != nil {
		releaseRange(d.base.Ranges, id, d.log)
	}
	dropSecrets(d.secrets, id, d.log)
	d.links.Release(id)
	r.live, r.park = nil, nil
	d.log.Info("run closed", "run", id, "reason", reason)
	d.events.Publish(events.Event{Kind: "run.closed", Run: id, Detail: reason})
	return d.runs.summary(id, r)
}

// releaseRange frees the user-namespace range run id held in ranges, once
// its sandboxes are gone; one not released is logged to log (the range
// stays held).
func releaseRange(ranges *idmap.Ranges, id string, log *slog.Logger) {
	if err := ranges.Release(id); err != nil {
		log.Error("user-namespace range not released", "run", id, "err", err)
	}
}

// releaseRanges frees, at a start, the user-namespace ranges in ranges of
// runs that no longer need one here and have no sandbox (owner, the
// sweep's): a run closed or unknown in st, or handed to another host. The
// probe's range stays held.
func releaseRanges(ranges *idmap.Ranges, st *store.Store, owner map[string]string, log *slog.Logger) {
	for _, id := range ranges.Holders() {
		if owner[id] != "" || id == executor.ProbeHolder {
			continue
		}
		run, err := st.Run(id)
		gone := errors.Is(err, store.ErrNoRun) || (err == nil && run.Phase == record.PhaseClosed)
		if err == nil && !gone {
			_, gone, err = st.HandedOff(id)
		}
		if err != nil && !errors.Is(err, store.ErrNoRun) {
			log.Warn("reconcile: user-namespace range of a run not read; kept", "run", id, "err", err)
			continue
		}
		if gone {
			releaseRange(ranges, id, log)
		}
	}
}
