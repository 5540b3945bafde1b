package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
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
	events attest.Journal // lifecycle entries of this interval so far
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

// begin starts an interval on sb: metering and journal offsets.
func (d *Daemon) begin(id string, sb *executor.Sandbox, spec unit.Spec, grants unit.Grants, event string) *live {
	out := d.outputOf(id)
	lv := &live{sb: sb, spec: spec, grants: grants, start: time.Now(), out: out,
		outOff: fileSize(out.Stdout), errOff: fileSize(out.Stderr)}
	cg, err := d.meter.CgroupOf(int(sb.Pid()))
	if err == nil {
		lv.iv, err = d.meter.Begin(cg)
	}
	if err != nil {
		lv.ivErr = err
		d.log.Warn("interval not metered from its start", "run", sb.ID(), "err", err)
	}
	lv.events.Add(attest.Lifecycle, nowNS(), []byte(event))
	return lv
}

// journalChunk bounds one output entry of a replay journal.
const journalChunk = 64 << 10

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
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err
	}
	at := nowNS()
	buf := make([]byte, journalChunk)
	for {
		n, err := io.ReadFull(f, buf)
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
	j := attest.Journal{Entries: append([]attest.Entry(nil), lv.events.Entries...)}
	if lv.transcript != nil {
		j.Entries = append(j.Entries, lv.transcript.journal()...)
	}
	if err := appendOutput(&j, attest.Stdout, lv.out.Stdout, lv.outOff); err != nil {
		return evidence{}, fmt.Errorf("journal: %w", err)
	}
	if err := appendOutput(&j, attest.Stderr, lv.out.Stderr, lv.errOff); err != nil {
		return evidence{}, fmt.Errorf("journal: %w", err)
	}
	j.Entries = append(j.Entries, extra...)
	rcb, err := rc.Canonical()
	if err != nil {
		return evidence{}, err
	}
	rcAddr, err := d.st.PutBytes(rcb)
	if err != nil {
		return evidence{}, err
	}
	jAddr, err := d.st.PutBytes(j.Encode())
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
	d.auditMu.Lock()
	prev := d.audit
	d.auditMu.Unlock()
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
	return evidence{seg: record.Execution(att, calls), att: att, receipt: rc}, nil
}

// attested advances the host's audit chain to ev's attestation once its
// segment is durable, and counts its receipt.
func (d *Daemon) attested(ev evidence) {
	d.metrics.receipt(ev.receipt)
	att := ev.att
	d.auditMu.Lock()
	defer d.auditMu.Unlock()
	if err := writeAudit(d.cfg.StateDir+"/audit-head", att); err != nil {
		d.log.Error("audit head not written", "err", err)
		return
	}
	d.audit = &att
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
