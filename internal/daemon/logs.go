package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/runlog"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Logs delivers run id's output to emit, across its intervals
// (internal/runlog): its sealed intervals' from their journals, its open
// interval's from its files here. A follow ends when the run is closed or
// handed off, when ctx ends, or when the daemon stops its streams
// (the events hub stopped: answers.ErrStopping). emit must not keep a chunk's data.
func (d *Daemon) Logs(ctx context.Context, id string, opt runlog.Options, emit func(runlog.Chunk) error) error {
	if _, err := d.st.Run(id); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ch, done := d.events.Subscribe()
	defer done()
	go func() {
		for range ch { // closed when the daemon stops its streams
		}
		cancel(answers.ErrStopping)
	}()
	err := runlog.Read(ctx, logSource{d: d, id: id}, opt, emit)
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, answers.ErrStopping) {
		return fmt.Errorf("run %s: %w", id, answers.ErrStopping)
	}
	return err
}

// logSource is a run's output on this host (runlog.Source).
type logSource struct {
	d  *Daemon
	id string
}

// State reads the run's record and open interval under its lock, without
// waiting for it: an operation in progress is runlog.ErrBusy.
func (s logSource) State() (runlog.State, error) {
	d := s.d
	r := d.runs.peek(s.id)
	if r != nil {
		if !r.mu.TryLock() {
			return runlog.State{}, runlog.ErrBusy
		}
		defer r.mu.Unlock()
	}
	sum, err := d.st.Run(s.id)
	if err != nil {
		return runlog.State{}, err
	}
	raw, err := d.st.Raw(s.id)
	if err != nil {
		return runlog.State{}, err
	}
	st := runlog.State{Sealed: len(executed(raw.Segments)), Done: sum.Phase == record.PhaseClosed || bundle.HeldHere(d.st, s.id) != nil}
	if r != nil && r.live != nil && !r.live.iv.Ended() {
		o := &runlog.Open{Files: r.live.iv.Files()}
		o.From[0], o.From[1] = r.live.iv.Offsets()
		for i, p := range []string{o.Files.Stdout, o.Files.Stderr} {
			o.Until[i] = o.From[i]
			if fi, err := os.Stat(p); err == nil {
				o.Until[i] = max(o.From[i], fi.Size())
			}
		}
		st.Open = o
	}
	return st, nil
}

// Journal opens the journal of the run's interval k, as the k-th
// Executed segment's attestation names it; it is verified as it is read.
func (s logSource) Journal(k int) (io.ReadCloser, error) {
	raw, err := s.d.st.Raw(s.id)
	if err != nil {
		return nil, err
	}
	ex := executed(raw.Segments)
	if k < 1 || k > len(ex) {
		return nil, fmt.Errorf("run %s: no interval %d", s.id, k)
	}
	b, err := s.d.st.ReadAll(ex[k-1].Attestation)
	if err != nil {
		return nil, err
	}
	body, err := attest.Open(b, nil)
	if err != nil {
		return nil, fmt.Errorf("interval %d: %w", k, err)
	}
	return s.d.st.Open(body.Journal)
}

// executed are segs' Executed segments, in order.
func executed(segs []record.Segment) []record.Segment {
	var out []record.Segment
	for _, s := range segs {
		if s.Kind == record.Executed {
			out = append(out, s)
		}
	}
	return out
}
