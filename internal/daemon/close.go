package daemon

import (
	"context"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Close closes a run, in any phase: a running unit's interval is recorded
// (outcome killed) with the Closed segment, and then its sandbox destroyed.
func (d *Daemon) Close(ctx context.Context, id, reason string) (answers.Summary, error) {
	if reason == "" {
		reason = "closed by request"
	}
	r, err := d.lockRun(id)
	if err != nil {
		return answers.Summary{}, err
	}
	defer r.mu.Unlock()
	st, err := d.st.Run(id)
	if err != nil {
		return answers.Summary{}, err
	}
	if st.Phase == record.Ended {
		return answers.Summary{}, fmt.Errorf("run %s: %w", id, record.ErrClosed)
	}
	if err := d.notHandedOff(id); err != nil {
		return answers.Summary{}, err
	}
	closed := record.Closure(reason)
	lv := r.live
	if lv != nil {
		// As a park does: nothing reaches the account between its
		// sealing and the close.
		defer lv.unit.Hold()()
		_, err = d.endAt(ctx, lv, "close.sealed", attest.Outcome{Kind: attest.Killed}, lv.unit.Account(), []record.Segment{closed})
	} else {
		err = d.fleet.Append(id, closed)
	}
	if err != nil {
		if lv != nil && lv.iv.Ended() {
			d.restartInterval(id, lv, attest.EventCloseRefused)
		}
		return answers.Summary{}, fmt.Errorf("close %s: %w", id, err)
	}
	d.reach("close.appended")
	d.warm().Discard(ctx, id, true)
	d.dropMark(id)
	if lv != nil {
		lv.stopping = true
		d.destroy(lv)
	}
	if r.teardown != nil {
		<-r.teardown
	}
	// Whatever else of the run this host still has goes too: the sandbox
	// of a run that was lost (its unit may be alive), or one a park left.
	forms.RemoveRun(ctx, d.ex, id, d.log)
	r.live, r.park = nil, nil
	d.log.Info("run closed", "run", id, "reason", reason)
	d.publish(events.Event{Kind: "run.closed", Run: id, Detail: reason})
	return d.summary(id, r)
}
