package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/executor"
	"github.com/runrecordd/runrecordd/pkg/idle"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// live is a run's sandbox on this host and its open interval.
type live struct {
	sb     *executor.Sandbox
	spec   unit.Spec
	grants unit.Grants
	iv     *idle.Interval // nil when the cgroup could not be read at start
	ivErr  error
	start  time.Time
	out    executor.Output
	outOff int64 // stdout and stderr sizes when the interval began
	errOff int64
	// discarded is what the sandbox had discarded of stdout and stderr
	// (past limits.log_bytes) when the interval began, as this daemon
	// process counts it.
	discarded [2]uint64
	events    attest.Journal // lifecycle entries of this interval so far
	// stopping is set, under the run's lock, before the daemon destroys
	// the sandbox on purpose, so that the exit watcher leaves it alone.
	stopping bool
	// transcript is the transcript-mode channel, nil for image mode.
	transcript *channel
}

func fileSize(p string) int64 {
	if p == "" {
		return 0
	}
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}

// mark is where an interval begins: its time and the unit's output sizes,
// taken before the sandbox starts so that nothing it writes falls between
// two journals; and, once metering began, the cgroup's CPU time. It is kept
// in runs/RUN/interval.json while the interval is open, so that a daemon
// restarted in the middle of an interval attests it from its real start.
type mark struct {
	StartNS int64          `json:"start_ns"`
	OutOff  int64          `json:"stdout_offset"`
	ErrOff  int64          `json:"stderr_offset"`
	CPUNS   uint64         `json:"cpu_ns"`
	Metered bool           `json:"metered"`
	Events  []attest.Entry `json:"events"`
}

// markNow is a mark at this instant for run id's output.
func (d *Daemon) markNow(id string) mark {
	out := d.outputOf(id)
	return mark{StartNS: nowNS(), OutOff: fileSize(out.Stdout), ErrOff: fileSize(out.Stderr)}
}

// begin starts an interval on sb from m: metering and journal offsets.
func (d *Daemon) begin(id string, sb *executor.Sandbox, spec unit.Spec, grants unit.Grants, event string, m mark) *live {
	out := d.outputOf(id)
	lv := &live{sb: sb, spec: spec, grants: grants, start: time.Unix(0, m.StartNS), out: out,
		outOff: m.OutOff, errOff: m.ErrOff}
	cg, err := d.meter.CgroupOf(int(sb.Pid()))
	if err == nil {
		lv.iv, err = d.meter.Begin(cg)
	}
	if err != nil {
		lv.ivErr = err
		d.log.Warn("interval not metered from its start", "run", id, "err", err)
	}
	lv.events.Add(attest.Lifecycle, nowNS(), []byte(event))
	lv.discarded[0], lv.discarded[1] = sb.Omitted()
	return lv
}

// reattach goes on with the interval an earlier daemon process began on
// sb, from the mark it saved (or from now, without one).
func (d *Daemon) reattach(id string, sb *executor.Sandbox, spec unit.Spec, grants unit.Grants) *live {
	m, ok := d.loadMark(id)
	if !ok {
		return d.begin(id, sb, spec, grants, "reattached (the interval's start was not saved)", d.markNow(id))
	}
	out := d.outputOf(id)
	lv := &live{sb: sb, spec: spec, grants: grants, start: time.Unix(0, m.StartNS), out: out,
		outOff: m.OutOff, errOff: m.ErrOff}
	lv.events.Entries = m.Events
	cg, err := d.meter.CgroupOf(int(sb.Pid()))
	if err == nil && m.Metered {
		lv.iv, err = d.meter.Reattach(cg, lv.start, m.CPUNS)
	} else if err == nil {
		err = fmt.Errorf("the interval was not metered from its start")
	}
	if err != nil {
		lv.ivErr = err
	}
	lv.events.Add(attest.Lifecycle, nowNS(), []byte("reattached"))
	return lv
}

func (d *Daemon) markPath(id string) string {
	return filepath.Join(d.cfg.StateDir, "runs", id, "interval.json")
}

// saveMark keeps lv's start for a restarted daemon.
func (d *Daemon) saveMark(id string, lv *live) {
	m := mark{StartNS: lv.start.UnixNano(), OutOff: lv.outOff, ErrOff: lv.errOff, Events: lv.events.Entries}
	if lv.iv != nil {
		m.CPUNS, m.Metered = lv.iv.CPUAtBegin(), true
	}
	b, err := json.Marshal(m)
	if err == nil {
		// Renamed into place but not fsynced: the mark serves a daemon
		// restarted by a crash of its own process (the page cache keeps
		// it); after a power loss the unit is gone with it anyway.
		err = writeFile(d.markPath(id), b)
	}
	if err != nil {
		d.log.Warn("interval start not saved; a restarted daemon attests it from the restart", "run", id, "err", err)
	}
}

func (d *Daemon) loadMark(id string) (mark, bool) {
	var m mark
	b, err := os.ReadFile(d.markPath(id))
	if err != nil || json.Unmarshal(b, &m) != nil {
		return mark{}, false
	}
	return m, true
}

func (d *Daemon) dropMark(id string) { os.Remove(d.markPath(id)) }

// journalChunk bounds one output entry of a replay journal.
const journalChunk = 64 << 10

// journalOutputMax bounds the output of one stream a replay journal holds
// for one interval. A journal is held in memory while it is sealed; a unit
// that writes more in one interval has its output's first part recorded
// as omitted (how many bytes, from which offset of its output file) and
// its last journalOutputMax bytes kept.
const journalOutputMax = 16 << 20

// appendOutput adds the bytes of file p from off on as entries of kind.
func appendOutput(j *attest.Journal, kind attest.EntryKind, p string, off int64) error {
	if p == "" {
		return nil
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	at := nowNS()
	if omitted := st.Size() - off - journalOutputMax; omitted > 0 {
		j.Add(attest.Lifecycle, at, fmt.Appendf(nil, `output-omitted {"stream":%d,"from_offset":%d,"bytes":%d}`, kind, off, omitted))
		off += omitted
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err
	}
	buf := make([]byte, journalChunk)
	r := io.LimitReader(f, journalOutputMax)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			j.Add(kind, at, append([]byte(nil), buf[:n]...))
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// evidence is an interval's sealed objects.
type evidence struct {
	seg     record.Segment
	att     record.Address
	receipt attest.Receipt
}

// end ends lv's interval and seals its evidence: receipt, replay journal
// and signed attestation, all durable objects. It does not append; the
// caller appends the returned segment (with what follows it) and then calls
// d.attested. extra entries go at the journal's end.
func (d *Daemon) end(ctx context.Context, id string, lv *live, outcome attest.Outcome, calls *record.CallAccount, extra ...attest.Entry) (evidence, error) {
	var rc attest.Receipt
	var err error
	if lv.iv != nil {
		rc, err = lv.iv.End()
	}
	if lv.iv == nil || err != nil {
		reason := lv.ivErr
		if err != nil {
			reason = err
		}
		rc = attest.Receipt{Provenance: record.Estimated, Method: "unmetered",
			WindowNS: uint64(time.Since(lv.start)), Inputs: map[string]string{"fallback": fmt.Sprint(reason)}}
	}
	endNS := nowNS()
	// The journal is streamed to the store: the lifecycle entries, the
	// channel's entries from its spool on disk (never all in memory),
	// the output, and extra.
	var chN int
	var chR io.Reader = strings.NewReader("")
	if lv.transcript != nil {
		chN, chR = lv.transcript.spooled()
	}
	var tail attest.Journal
	if err := appendOutput(&tail, attest.Stdout, lv.out.Stdout, lv.outOff); err != nil {
		return evidence{}, fmt.Errorf("journal: %w", err)
	}
	if err := appendOutput(&tail, attest.Stderr, lv.out.Stderr, lv.errOff); err != nil {
		return evidence{}, fmt.Errorf("journal: %w", err)
	}
	// Output the unit wrote past its log limit was discarded, not kept:
	// the journal says how much, so the omission is on the record.
	if lv.sb != nil {
		out, errs := lv.sb.Omitted()
		if out > lv.discarded[0] || errs > lv.discarded[1] {
			tail.Add(attest.Lifecycle, endNS, fmt.Appendf(nil, `output-discarded {"stdout_bytes":%d,"stderr_bytes":%d,"limit_bytes":%d}`,
				out-min(out, lv.discarded[0]), errs-min(errs, lv.discarded[1]), lv.grants.Limits.Or(unit.DefaultLimits).LogBytes))
		}
	}
	tail.Entries = append(tail.Entries, extra...)
	rcb, err := rc.Canonical()
	if err != nil {
		return evidence{}, err
	}
	rcAddr, err := d.st.PutBytes(rcb)
	if err != nil {
		return evidence{}, err
	}
	jr := journalReader(len(lv.events.Entries)+chN+len(tail.Entries),
		bytes.NewReader(encodeEntries(lv.events.Entries)), chR, bytes.NewReader(encodeEntries(tail.Entries)))
	jAddr, err := d.st.Put(ctx, jr)
	if err != nil {
		return evidence{}, err
	}
	st, err := d.st.Run(id)
	if err != nil {
		return evidence{}, err
	}
	n, err := d.intervals(id)
	if err != nil {
		return evidence{}, err
	}
	// The host's audit chain advances here, at signing, under one lock:
	// two intervals sealed at once never share an audit_prev.
	d.auditMu.Lock()
	defer d.auditMu.Unlock()
	prev := d.audit
	body := &attest.Body{
		Genesis:   record.Genesis(st.Unit, st.Grants),
		Interval:  n + 1,
		PrevHead:  st.Head,
		StartNS:   lv.start.UnixNano(),
		EndNS:     endNS,
		Receipt:   rcAddr,
		Journal:   jAddr,
		Outcome:   outcome,
		AuditPrev: prev,
	}
	signed, err := attest.Sign(body, d.key)
	if err != nil {
		return evidence{}, err
	}
	att, err := d.st.PutBytes(signed.Encode(), rcAddr, jAddr)
	if err != nil {
		return evidence{}, err
	}
	// The next attestation names this one as audit_prev: it is kept
	// whether or not a segment ever names it.
	if err := d.st.AddRoot(att); err != nil {
		return evidence{}, err
	}
	if err := writeAudit(filepath.Join(d.cfg.StateDir, "audit-head"), att); err != nil {
		return evidence{}, fmt.Errorf("audit head: %w", err)
	}
	d.audit = &att
	return evidence{seg: record.Execution(att, calls), att: att, receipt: rc}, nil
}

// parkedOutcome is the Suspended segment a park appends and the outcome
// of the interval it ends, which names that segment: the attestation's
// signature covers the snapshot and manifest a park leaves, the record's
// tail (docs/attestation.md).
func parkedOutcome(snap record.Snapshot, man record.Address) (record.Segment, attest.Outcome, error) {
	s := record.Suspension(snap, man)
	c, err := s.Canonical()
	if err != nil {
		return record.Segment{}, attest.Outcome{}, err
	}
	return s, attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}, nil
}

// attested counts an interval's receipt once its segment is durable.
func (d *Daemon) attested(ev evidence) {
	d.metrics.receipt(ev.receipt)
}

// intervals counts the run's Executed segments.
func (d *Daemon) intervals(id string) (uint64, error) {
	raw, err := d.st.Raw(id)
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

// lifecycle is a journal entry with a JSON detail.
func lifecycle(event string, detail any) attest.Entry {
	b := []byte(event)
	if detail != nil {
		if j, err := json.Marshal(detail); err == nil {
			b = append(append(b, ' '), j...)
		}
	}
	return attest.Entry{Kind: attest.Lifecycle, AtNS: nowNS(), Data: b}
}

func checkpointOf(s executor.CheckpointStats, ingest time.Duration) *api.Checkpoint {
	return &api.Checkpoint{
		TotalNS: int64(s.Total), PauseNS: int64(s.Pause), DumpNS: int64(s.Dump), DiffNS: int64(s.Diff),
		FreezingNS: int64(s.Freezing), FrozenNS: int64(s.Frozen), MemDumpNS: int64(s.MemDump), MemWriteNS: int64(s.MemWrite),
		Pages: s.PagesWritten, PagesScan: s.PagesScanned, ImageBytes: s.ImageBytes, RootBytes: s.RootfsBytes,
		IngestNS: int64(ingest),
	}
}

func energyOf(rc attest.Receipt) api.Energy {
	return api.Energy{UJ: rc.UJ, Provenance: rc.Provenance.String(), Method: rc.Method, Inputs: rc.Inputs}
}
