// Package runlog reads a run's output, stdout and stderr, across its
// intervals (GET /v1/runs/{id}/logs). A sealed interval's output is read
// from its replay journal (internal/interval), so it survives parks and
// migrations; the interval open on this host is read from its output
// files, from the offsets its mark took. What an interval's journal left
// out past its bound, and what the sandbox discarded past the unit's log
// limit, come as marks.
//
// Output is delivered as [Chunk]s in order: interval by interval, and in
// each sealed interval its stdout, then its stderr (a journal keeps the
// two streams apart; their interleaving is not recorded). A chunk holds
// one line, or a piece of one: a chunk that does not end in a newline is
// continued by the next chunk of its interval and stream, if any. Nothing
// holds more than one piece (at most [MaxPiece] bytes) in memory.
package runlog

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"time"

	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/attest"
)

// MaxPiece bounds one chunk's bytes.
const MaxPiece = 64 << 10

// DefaultPoll is how often a follow looks for new output.
const DefaultPoll = 200 * time.Millisecond

// maxOmitted bounds the bytes a mark in a journal (which may come from
// another host's bundle) is taken to leave out, so that no sum overflows.
const maxOmitted = 1 << 60

// ErrBusy is a run whose state cannot be read now (an operation holds
// it): a reader tries again at its next poll.
var ErrBusy = errors.New("run busy")

// Mark reasons.
const (
	// ReasonJournalCap is output an interval's journal left out past its
	// per-stream bound (interval.JournalOutputMax): the first part.
	ReasonJournalCap = "journal-cap"
	// ReasonLogLimit is output the sandbox discarded past the unit's log
	// limit.
	ReasonLogLimit = "log-limit"
)

// Chunk is one piece of output, or a mark of output left out.
type Chunk struct {
	Interval uint64           // 1 for the run's first interval
	Stream   attest.EntryKind // attest.Stdout or attest.Stderr
	Data     []byte           // a line or a piece of one; nil in a mark
	// AtNS is when the output was recorded: its interval's sealing for a
	// sealed interval, when it was read for the open one.
	AtNS int64
	// Omitted and Reason make a mark: that many bytes left out, and why
	// (ReasonJournalCap or ReasonLogLimit).
	Omitted int64
	Reason  string
}

// State is a run's output as it is at one instant.
type State struct {
	Sealed int   // the run's sealed intervals (its Executed segments)
	Open   *Open // the interval open on this host (number Sealed+1); nil when none
	// Done is a run whose output is over here: closed, or handed off.
	Done bool
}

// Open is the open interval's output: bytes From to Until of each file
// (index 0 stdout, 1 stderr) are the interval's so far.
type Open struct {
	Files       interval.Output
	From, Until [2]int64
}

// Source is what a run's output is read from.
type Source interface {
	// State is the run's state now, taken at one instant (ErrBusy when it
	// cannot be taken now).
	State() (State, error)
	// Journal opens the sealed journal of interval k (1-based).
	Journal(k int) (io.ReadCloser, error)
}

// Options select what Read delivers.
type Options struct {
	// Follow goes on delivering new output until the run is closed or
	// handed off, or ctx ends.
	Follow bool
	// Tail, when not negative, starts at the last Tail lines of the
	// output there is when Read begins (a line cut at the end of its
	// interval's stream counts as one).
	Tail int
	// Since, when set, leaves out sealed intervals' output recorded before
	// it. The open interval's output is always delivered: its lines carry
	// no time of their own.
	Since time.Time
	// Poll is how often a follow looks for new output (DefaultPoll when 0).
	Poll time.Duration
	// Flush, when set, is called when what there was is delivered: after
	// the history, and after each poll of a follow that delivered.
	Flush func()
}

// Read delivers run src's output to emit, in order (see the package
// documentation). It returns emit's first error, ctx's when it ends, or an
// error reading a journal or a file.
func Read(ctx context.Context, src Source, opt Options, emit func(Chunk) error) error {
	if opt.Poll <= 0 {
		opt.Poll = DefaultPoll
	}
	st, err := state(ctx, src, opt.Poll)
	if err != nil {
		return err
	}
	r := &reader{src: src, opt: opt, emit: emit}
	if opt.Tail >= 0 {
		// First pass: count the lines, to skip all but the last Tail.
		c := &reader{src: src, opt: opt, emit: func(Chunk) error { return nil }}
		if err := c.history(st); err != nil {
			return err
		}
		c.endStream()
		r.skip = max(0, c.lines-int64(opt.Tail))
	}
	if err := r.history(st); err != nil {
		return err
	}
	r.skip = 0
	flush := func() {
		if opt.Flush != nil {
			opt.Flush()
		}
	}
	flush()
	if !opt.Follow {
		return nil
	}
	t := time.NewTicker(opt.Poll)
	defer t.Stop()
	for {
		if st.Done && st.Open == nil && r.next > st.Sealed {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		st, err = src.State()
		if errors.Is(err, ErrBusy) {
			continue
		}
		if err != nil {
			return err
		}
		before := r.emitted
		if err := r.advance(st); err != nil {
			return err
		}
		if r.emitted != before {
			flush()
		}
	}
}

// state is src's state, waiting out ErrBusy.
func state(ctx context.Context, src Source, poll time.Duration) (State, error) {
	for {
		st, err := src.State()
		if !errors.Is(err, ErrBusy) {
			return st, err
		}
		select {
		case <-ctx.Done():
			return State{}, ctx.Err()
		case <-time.After(poll):
		}
	}
}

type reader struct {
	src  Source
	opt  Options
	emit func(Chunk) error

	next int      // the interval delivered next (1-based)
	pos  [2]int64 // bytes of interval next's streams delivered
	// lines counts the lines passed; those below skip are not delivered.
	lines, skip int64
	emitted     int64 // chunks delivered
	// partial is a stream whose last piece passed did not end a line.
	partial [2]bool
}

// history delivers st's output: its sealed intervals, then the open one's
// output so far.
func (r *reader) history(st State) error {
	r.next, r.pos, r.lines, r.partial = 1, [2]int64{}, 0, [2]bool{}
	return r.advance(st)
}

// advance delivers what st has past what was delivered.
func (r *reader) advance(st State) error {
	for r.next <= st.Sealed {
		if err := r.journal(r.next); err != nil {
			return err
		}
		r.next, r.pos = r.next+1, [2]int64{}
	}
	if st.Open == nil || r.next != st.Sealed+1 {
		return nil
	}
	at := time.Now().UnixNano()
	for i, p := range []string{st.Open.Files.Stdout, st.Open.Files.Stderr} {
		from := st.Open.From[i] + r.pos[i]
		if err := r.file(p, i, from, st.Open.Until[i], at); err != nil {
			return err
		}
		r.pos[i] = max(r.pos[i], st.Open.Until[i]-st.Open.From[i])
	}
	return nil
}

// journal delivers interval k's output from its journal, past what was
// delivered of it from its files while it was open.
func (r *reader) journal(k int) error {
	rc, err := r.src.Journal(k)
	if err != nil {
		return err
	}
	defer rc.Close()
	var rel [2]int64 // where the next entry's bytes begin in its stream
	buf := make([]byte, MaxPiece)
	err = attest.ScanJournal(rc, func(kind attest.EntryKind, atNS int64, data io.Reader) error {
		switch kind {
		case attest.Stdout, attest.Stderr:
			i := int(kind) - 1
			for {
				n, err := io.ReadFull(data, buf)
				if n > 0 {
					if err := r.bytes(k, kind, atNS, buf[:n], rel[i]); err != nil {
						return err
					}
					rel[i] += int64(n)
				}
				if err == io.EOF || err == io.ErrUnexpectedEOF {
					return nil
				}
				if err != nil {
					return err
				}
			}
		case attest.Lifecycle:
			return r.lifecycle(k, atNS, data, &rel)
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.endStream()
	return nil
}

// lifecycle delivers the marks of a lifecycle entry.
func (r *reader) lifecycle(k int, atNS int64, data io.Reader, rel *[2]int64) error {
	b, err := io.ReadAll(io.LimitReader(data, 4<<10))
	if err != nil {
		return err
	}
	var om attest.OutputOmitted
	var dis attest.OutputDiscarded
	j := attest.Journal{Entries: []attest.Entry{{Kind: attest.Lifecycle, Data: b}}}
	switch {
	case j.Find(&om) && (om.Stream == attest.Stdout || om.Stream == attest.Stderr) && om.Bytes > 0 && om.Bytes < maxOmitted:
		i := int(om.Stream) - 1
		end := rel[i] + om.Bytes
		if n := end - max(r.pos[i], rel[i]); n > 0 {
			if err := r.mark(Chunk{Interval: uint64(k), Stream: om.Stream, AtNS: atNS, Omitted: n, Reason: ReasonJournalCap}); err != nil {
				return err
			}
		}
		rel[i] = end
	case j.Find(&dis):
		for _, m := range []struct {
			s attest.EntryKind
			n uint64
		}{{attest.Stdout, dis.StdoutBytes}, {attest.Stderr, dis.StderrBytes}} {
			if m.n == 0 {
				continue
			}
			if err := r.mark(Chunk{Interval: uint64(k), Stream: m.s, AtNS: atNS, Omitted: int64(min(m.n, 1<<62)), Reason: ReasonLogLimit}); err != nil {
				return err
			}
		}
	}
	return nil
}

// file delivers bytes from to until of stream i's file p, for the open
// interval.
func (r *reader) file(p string, i int, from, until, atNS int64) error {
	if p == "" || from >= until {
		return nil
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil // gone with the run
	}
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, MaxPiece)
	kind := attest.EntryKind(i + 1)
	for from < until {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), until-from)], from)
		if n > 0 {
			if err := r.piece(Chunk{Interval: uint64(r.next), Stream: kind, AtNS: atNS, Data: buf[:n]}); err != nil {
				return err
			}
			from += int64(n)
		}
		if err == io.EOF {
			return nil // truncated under us: what there was
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// bytes delivers b, bytes at rel of interval k's stream, past what was
// delivered of it.
func (r *reader) bytes(k int, kind attest.EntryKind, atNS int64, b []byte, rel int64) error {
	i := int(kind) - 1
	if skip := r.pos[i] - rel; skip > 0 {
		b = b[min(skip, int64(len(b))):]
	}
	if len(b) == 0 || (!r.opt.Since.IsZero() && atNS < r.opt.Since.UnixNano()) {
		return nil
	}
	return r.piece(Chunk{Interval: uint64(k), Stream: kind, AtNS: atNS, Data: b})
}

// piece delivers c's data a line (or a piece of one) at a time, counting
// lines, unless they are skipped.
func (r *reader) piece(c Chunk) error {
	data := c.Data
	i := int(c.Stream) - 1
	if r.partial[1-i] {
		// The other stream's cut line ends where this stream's output
		// is delivered.
		r.partial[1-i] = false
		r.lines++
	}
	for len(data) > 0 {
		n := bytes.IndexByte(data, '\n') + 1
		if n == 0 {
			n = len(data)
		}
		if r.lines >= r.skip {
			c.Data = data[:n]
			r.emitted++
			if err := r.emit(c); err != nil {
				return err
			}
		}
		r.partial[i] = data[n-1] != '\n'
		if !r.partial[i] {
			r.lines++
		}
		data = data[n:]
	}
	return nil
}

// endStream ends an interval's streams: a line cut there counts as one.
func (r *reader) endStream() {
	for i, p := range r.partial {
		if p {
			r.lines++
			r.partial[i] = false
		}
	}
}

func (r *reader) mark(c Chunk) error {
	if r.lines < r.skip || (!r.opt.Since.IsZero() && c.AtNS < r.opt.Since.UnixNano()) {
		return nil
	}
	r.emitted++
	return r.emit(c)
}

// StreamName is "stdout" or "stderr".
func StreamName(k attest.EntryKind) string {
	if k == attest.Stderr {
		return "stderr"
	}
	return "stdout"
}
