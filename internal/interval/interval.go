package interval

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Store is what an interval needs of the store (*store.Store).
type Store interface {
	Put(ctx context.Context, r io.Reader, refs ...record.Address) (record.Address, error)
	PutBytes(b []byte, refs ...record.Address) (record.Address, error)
	AddRoot(a record.Address) error
	Run(id string) (store.Run, error)
	Raw(id string) (store.Raw, error)
	AppendAll(id string, head record.Address, segs ...record.Segment) (record.Address, error)
}

// Meter starts metering a unit's cgroup (an adapter over *idle.Meter).
type Meter interface {
	CgroupOf(pid int) (string, error)
	Begin(cgroup string) (Metering, error)
	Reattach(cgroup string, start time.Time, cpuNS uint64) (Metering, error)
}

// Metering is one interval's meter (*idle.Interval).
type Metering interface {
	End() (attest.Receipt, error)
	CPUAtBegin() uint64
}

// Sandbox is what an interval reads of the unit's sandbox
// (*executor.Sandbox).
type Sandbox interface {
	Pid() uint32
	// Omitted is the bytes of stdout and stderr the sandbox discarded
	// past the unit's log limit, so far.
	Omitted() (stdout, stderr uint64)
}

// Interval is an open interval of one run.
type Interval struct {
	run      string
	sb       Sandbox
	out      Output
	markPath string
	start    time.Time
	outOff   int64
	errOff   int64
	// discarded is what the sandbox had discarded when the interval
	// began, as this process counts it.
	discarded [2]uint64
	// traffic is the run's egress counters when the interval began (the
	// mark's).
	traffic  *Counters
	logLimit uint64
	events   attest.Journal
	meter    Metering // nil when the interval is not metered
	meterErr error    // why not
	channel  func() (int, io.Reader)
	ended    bool
}

// Config is where an interval's run keeps its files.
type Config struct {
	Run      string
	Output   Output
	MarkPath string // the saved mark (interval.json)
	LogLimit uint64 // the unit's log limit, for the journal's note of discarded output
}

// Begin opens an interval on sb from m, metering sb's cgroup from now, and
// journals event.
func Begin(cfg Config, sb Sandbox, meter Meter, m Mark, event string) *Interval {
	iv := open(cfg, sb, m)
	cg, err := meter.CgroupOf(int(sb.Pid()))
	if err == nil {
		iv.meter, err = meter.Begin(cg)
	}
	if err != nil {
		iv.meter, iv.meterErr = nil, err
	}
	iv.events.Entries = append(iv.events.Entries, attest.Event(time.Now().UnixNano(), event))
	iv.discarded = m.Discarded
	return iv
}

// Reattach goes on with the interval an earlier daemon process began on
// sb, from the mark it saved at cfg.MarkPath (from now when there is none).
func Reattach(cfg Config, sb Sandbox, meter Meter) *Interval {
	m, ok := LoadMark(cfg.MarkPath)
	if !ok {
		return Begin(cfg, sb, meter, MarkAt(time.Now().UnixNano(), cfg.Output), "reattached (the interval's start was not saved)")
	}
	iv := open(cfg, sb, m)
	iv.events.Entries = m.Events
	cg, err := meter.CgroupOf(int(sb.Pid()))
	if err == nil && m.Metered {
		iv.meter, err = meter.Reattach(cg, iv.start, m.CPUNS)
	} else if err == nil {
		err = errors.New("the interval was not metered from its start")
	}
	if err != nil {
		iv.meter, iv.meterErr = nil, err
	}
	iv.events.Entries = append(iv.events.Entries, attest.Event(time.Now().UnixNano(), attest.EventReattached))
	return iv
}

func open(cfg Config, sb Sandbox, m Mark) *Interval {
	return &Interval{run: cfg.Run, sb: sb, out: cfg.Output, markPath: cfg.MarkPath, logLimit: cfg.LogLimit,
		start: time.Unix(0, m.StartNS), outOff: m.OutOff, errOff: m.ErrOff, traffic: m.Traffic}
}

// Start is when the interval began.
func (iv *Interval) Start() time.Time { return iv.start }

// MeterErr is why the interval is not metered (nil when it is).
func (iv *Interval) MeterErr() error { return iv.meterErr }

// Journal adds lifecycle entries to the interval's journal.
func (iv *Interval) Journal(es ...attest.Entry) { iv.events.Entries = append(iv.events.Entries, es...) }

// Events are the interval's lifecycle entries so far.
func (iv *Interval) Events() []attest.Entry { return iv.events.Entries }

// Channel sets where the interval's channel entries are spooled: spooled
// returns their count and encoded bytes (attest.AppendEntry's form).
func (iv *Interval) Channel(spooled func() (int, io.Reader)) { iv.channel = spooled }

// Ended reports whether End ran, whatever it returned: the metering is
// over, and a unit that goes on needs a new interval.
func (iv *Interval) Ended() bool { return iv.ended }

// Save keeps the interval's mark for a restarted daemon.
func (iv *Interval) Save() error {
	m := Mark{StartNS: iv.start.UnixNano(), OutOff: iv.outOff, ErrOff: iv.errOff, Events: iv.events.Entries, Traffic: iv.traffic}
	if iv.meter != nil {
		m.CPUNS, m.Metered = iv.meter.CPUAtBegin(), true
	}
	return SaveMark(iv.markPath, m)
}

// Drop removes the saved mark (after the interval was recorded, or never
// will be).
func (iv *Interval) Drop() { DropMark(iv.markPath) }

// Env is what End writes to.
type Env struct {
	Store  Store
	Signer *Signer
	// Sealed, when set, runs once the evidence is durable and before the
	// append (the daemon's crash tests stop there).
	Sealed func()
}

// Ending is what an interval ends with: its outcome, the Executed
// segment's call account (nil: not accounted), the segments appended with
// it in one transaction, and entries for the journal's end.
type Ending struct {
	Outcome attest.Outcome
	Calls   *record.CallAccount
	Then    []record.Segment
	Extra   []attest.Entry
}

// Sealed is a recorded interval.
type Sealed struct {
	Segment     record.Segment // the Executed segment
	Attestation record.Address
	Receipt     attest.Receipt
	Head        record.Address  // the record's head after the segments
	Traffic     *attest.Traffic // the journal's traffic entry; nil without one
}

// ErrSeal wraps a failure to seal an interval's evidence (nothing was
// appended); a refused append is the store's or pkg/record's error.
var ErrSeal = errors.New("sealing the interval")

// End ends the interval with e's outcome and records it: the Executed
// segment carrying e.Calls, then e.Then, in one transaction (see the
// package doc for the order). e.Extra goes at the journal's end.
func (iv *Interval) End(ctx context.Context, env Env, e Ending) (Sealed, error) {
	outcome, calls, then, extra := e.Outcome, e.Calls, e.Then, e.Extra
	if iv.ended {
		return Sealed{}, fmt.Errorf("%w: run %s: the interval has already ended", ErrSeal, iv.run)
	}
	iv.ended = true
	rc := iv.receipt()
	endNS := time.Now().UnixNano()
	rcb, err := rc.Canonical()
	if err != nil {
		return Sealed{}, fmt.Errorf("%w: receipt: %w", ErrSeal, err)
	}
	rcAddr, err := env.Store.PutBytes(rcb)
	if err != nil {
		return Sealed{}, fmt.Errorf("%w: receipt: %w", ErrSeal, err)
	}
	jAddr, err := iv.putJournal(ctx, env.Store, endNS, extra)
	if err != nil {
		return Sealed{}, fmt.Errorf("%w: journal: %w", ErrSeal, err)
	}
	st, err := env.Store.Run(iv.run)
	if err != nil {
		return Sealed{}, fmt.Errorf("%w: %w", ErrSeal, err)
	}
	n, err := executedIntervals(env.Store, iv.run)
	if err != nil {
		return Sealed{}, fmt.Errorf("%w: %w", ErrSeal, err)
	}
	att, err := env.Signer.seal(env.Store, &attest.Body{
		Genesis: record.Genesis(st.Unit, st.Grants), Interval: n + 1, PrevHead: st.Head,
		StartNS: iv.start.UnixNano(), EndNS: endNS, Receipt: rcAddr, Journal: jAddr, Outcome: outcome,
	})
	if err != nil {
		return Sealed{}, fmt.Errorf("%w: attestation: %w", ErrSeal, err)
	}
	if env.Sealed != nil {
		env.Sealed()
	}
	seg := record.Execution(att, calls)
	head, err := env.Store.AppendAll(iv.run, st.Head, append([]record.Segment{seg}, then...)...)
	if err != nil {
		return Sealed{}, err
	}
	iv.Drop()
	return Sealed{Segment: seg, Attestation: att, Receipt: rc, Head: head}, nil
}

// receipt ends the metering; an interval that was not metered, or whose
// meter fails now, gets an estimated receipt that says why.
func (iv *Interval) receipt() attest.Receipt {
	reason := iv.meterErr
	if iv.meter != nil {
		rc, err := iv.meter.End()
		if err == nil {
			return rc
		}
		reason = err
	}
	return attest.Receipt{Provenance: record.Estimated, Method: "unmetered",
		WindowNS: uint64(time.Since(iv.start)), Inputs: map[string]string{"fallback": fmt.Sprint(reason)}}
}

// putJournal streams the journal to the store: the lifecycle entries, the
// channel's spooled entries (never all in memory), the output since the
// mark, a note of output discarded past the log limit, and extra.
func (iv *Interval) putJournal(ctx context.Context, st Store, endNS int64, extra []attest.Entry) (record.Address, error) {
	var chN int
	var chR io.Reader = strings.NewReader("")
	if iv.channel != nil {
		chN, chR = iv.channel()
	}
	var tail attest.Journal
	if err := appendOutput(&tail, attest.Stdout, iv.out.Stdout, iv.outOff); err != nil {
		return record.Address{}, err
	}
	if err := appendOutput(&tail, attest.Stderr, iv.out.Stderr, iv.errOff); err != nil {
		return record.Address{}, err
	}
	// Output the unit wrote past its log limit was discarded, not kept:
	// the journal says how much, so the omission is on the record.
	if iv.sb != nil {
		out, errs := iv.sb.Omitted()
		if out > iv.discarded[0] || errs > iv.discarded[1] {
			tail.Entries = append(tail.Entries, attest.LifecycleOf(endNS, attest.OutputDiscarded{
				StdoutBytes: out - min(out, iv.discarded[0]), StderrBytes: errs - min(errs, iv.discarded[1]), LimitBytes: iv.logLimit}))
		}
	}
	tail.Entries = append(tail.Entries, extra...)
	n := len(iv.events.Entries) + chN + len(tail.Entries)
	return st.Put(ctx, attest.JournalReader(n, bytes.NewReader(attest.EncodeEntries(iv.events.Entries)), chR,
		bytes.NewReader(attest.EncodeEntries(tail.Entries))))
}

// executedIntervals counts the run's Executed segments: the next
// attestation's interval number is one more.
func executedIntervals(st Store, run string) (uint64, error) {
	raw, err := st.Raw(run)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, s := range raw.Segments {
		if s.Kind == record.Executed {
			n++
		}
	}
	return n, nil
}

// Parked is the outcome of an interval that ends in a park, and the
// Suspended segment the park appends after it: the attestation's signature
// covers the snapshot and manifest the park leaves, the record's tail
// (docs/attestation.md).
func Parked(snap record.Snapshot, manifest record.Address) (attest.Outcome, record.Segment, error) {
	s := record.Suspension(snap, manifest)
	c, err := s.Canonical()
	if err != nil {
		return attest.Outcome{}, record.Segment{}, err
	}
	return attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}, s, nil
}
