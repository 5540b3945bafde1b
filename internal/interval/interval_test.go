package interval

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// fakeSandbox is a unit's sandbox as an interval reads it.
type fakeSandbox struct {
	mu       sync.Mutex
	out, err uint64 // discarded output so far
}

func (f *fakeSandbox) Pid() uint32 { return 4242 }

func (f *fakeSandbox) Omitted() (uint64, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.out, f.err
}

// fakeMeter meters every cgroup with a fixed figure, or fails to find one.
type fakeMeter struct{ noCgroup error }

func (m fakeMeter) CgroupOf(int) (string, error) {
	if m.noCgroup != nil {
		return "", m.noCgroup
	}
	return "/unit", nil
}

func (m fakeMeter) Begin(string) (Metering, error) { return &fakeMetering{cpu: 7}, nil }

func (m fakeMeter) Reattach(_ string, _ time.Time, cpu uint64) (Metering, error) {
	return &fakeMetering{cpu: cpu}, nil
}

type fakeMetering struct{ cpu uint64 }

func (f *fakeMetering) End() (attest.Receipt, error) {
	return attest.Receipt{UJ: 1234, Provenance: record.Measured, Method: "test", CPUNS: f.cpu}, nil
}

func (f *fakeMetering) CPUAtBegin() uint64 { return f.cpu }

// faultyStore fails the calls it is told to. failPut fails PutBytes once
// putBytesOK calls have succeeded (none by default).
type faultyStore struct {
	*store.Store
	failPut    error
	putBytesOK int
	failStream error // Put
	failRun    error
	failRaw    error
	failRoot   error
	failAppend error
}

func (f *faultyStore) AddRoot(a record.Address) error {
	if f.failRoot != nil {
		return f.failRoot
	}
	return f.Store.AddRoot(a)
}

func (f *faultyStore) PutBytes(b []byte, refs ...record.Address) (record.Address, error) {
	if f.failPut != nil {
		if f.putBytesOK == 0 {
			return record.Address{}, f.failPut
		}
		f.putBytesOK--
	}
	return f.Store.PutBytes(b, refs...)
}

func (f *faultyStore) Put(ctx context.Context, r io.Reader, refs ...record.Address) (record.Address, error) {
	if f.failStream != nil {
		return record.Address{}, f.failStream
	}
	return f.Store.Put(ctx, r, refs...)
}

func (f *faultyStore) Run(id string) (store.Run, error) {
	if f.failRun != nil {
		return store.Run{}, f.failRun
	}
	return f.Store.Run(id)
}

func (f *faultyStore) Raw(id string) (store.Raw, error) {
	if f.failRaw != nil {
		return store.Raw{}, f.failRaw
	}
	return f.Store.Raw(id)
}

func (f *faultyStore) AppendAll(id string, head record.Address, segs ...record.Segment) (record.Address, error) {
	if f.failAppend != nil {
		return record.Address{}, f.failAppend
	}
	return f.Store.AppendAll(id, head, segs...)
}

// host is one daemon's store, signer and state directory. Its cleanup
// verifies every record from genesis, and every attestation at its place.
type host struct {
	dir    string
	st     *store.Store
	signer *Signer
	key    ed25519.PrivateKey
}

func newHost(t *testing.T) *host {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, 32))
	s, err := NewSigner(key, filepath.Join(dir, "audit-head"))
	if err != nil {
		t.Fatal(err)
	}
	h := &host{dir: dir, st: st, signer: s, key: key}
	t.Cleanup(func() {
		if _, err := st.Check(context.Background()); err != nil {
			t.Errorf("cleanup: store check: %v", err)
		}
		ids, err := st.AllRuns()
		if err != nil {
			t.Error(err)
		}
		for _, id := range ids {
			rec, err := st.Record(id)
			if err != nil {
				t.Errorf("cleanup: run %s: %v", id, err)
				continue
			}
			if _, err := attest.CheckRecord(rec, st.ReadAll, nil); err != nil {
				t.Errorf("cleanup: run %s: attestations out of place: %v", id, err)
			}
		}
		st.Close()
	})
	return h
}

// run creates a run with its unit's output files.
func (h *host) run(t *testing.T, id string) Config {
	t.Helper()
	if _, err := h.st.Create(id, record.Sum([]byte("unit "+id)), record.Sum([]byte("grants "+id))); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.dir, "runs", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return Config{Run: id, Output: Output{Stdout: filepath.Join(dir, "stdout"), Stderr: filepath.Join(dir, "stderr")},
		MarkPath: filepath.Join(dir, "interval.json"), LogLimit: 1 << 20}
}

func (h *host) env() Env { return Env{Store: h.st, Signer: h.signer} }

func (h *host) body(t *testing.T, att record.Address) *attest.Body {
	t.Helper()
	b, err := h.st.ReadAll(att)
	if err != nil {
		t.Fatal(err)
	}
	body, err := attest.Open(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func (h *host) journal(t *testing.T, a record.Address) *attest.Journal {
	t.Helper()
	b, err := h.st.ReadAll(a)
	if err != nil {
		t.Fatal(err)
	}
	j, err := attest.DecodeJournal(b)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func appendFile(t *testing.T, p, s string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// An interval records, in one End: its evidence, the Executed segment at
// its place, the segments after it, and the host's audit chain.
func TestEndRecordsWholeIntervals(t *testing.T) {
	h := newHost(t)
	cfg := h.run(t, "r")
	appendFile(t, cfg.Output.Stdout, "before the interval\n")
	iv := Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(time.Now().UnixNano(), cfg.Output), "started")
	if err := iv.Save(); err != nil {
		t.Fatal(err)
	}
	appendFile(t, cfg.Output.Stdout, "during\n")
	first, err := iv.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Running}, Calls: &record.CallAccount{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := LoadMark(cfg.MarkPath); ok {
		t.Fatal("the mark outlived the recorded interval")
	}
	b := h.body(t, first.Attestation)
	g := record.Genesis(record.Sum([]byte("unit r")), record.Sum([]byte("grants r")))
	if b.Genesis != g || b.Interval != 1 || b.PrevHead != g || b.AuditPrev != nil || b.HostKey != h.signer.KeyID() {
		t.Fatalf("first body %+v", b)
	}
	var out string
	for _, e := range h.journal(t, b.Journal).Entries {
		if e.Kind == attest.Stdout {
			out += string(e.Data)
		}
	}
	if out != "during\n" {
		t.Fatalf("journal holds %q of stdout, want only the interval's", out)
	}

	// The second interval ends in a park: Executed and Suspended, both.
	iv = Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(time.Now().UnixNano(), cfg.Output), "resumed")
	man, _ := h.st.PutBytes([]byte("manifest"))
	tr, _ := h.st.PutBytes([]byte("transcript"))
	outcome, susp, err := Parked(record.TranscriptSnapshot(tr), man)
	if err != nil {
		t.Fatal(err)
	}
	second, err := iv.End(t.Context(), h.env(), Ending{Outcome: outcome, Then: []record.Segment{susp}})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := h.st.Run("r")
	if st.Len != 3 || st.Phase != record.PhaseParked || second.Head != st.Head {
		t.Fatalf("run after a park: %d segments, %s", st.Len, st.Phase)
	}
	b2 := h.body(t, second.Attestation)
	if b2.Interval != 2 || b2.AuditPrev == nil || *b2.AuditPrev != first.Attestation || b2.Receipt != record.Sum(mustCanon(t, second.Receipt)) {
		t.Fatalf("second body %+v", b2)
	}
	if got, _ := os.ReadFile(filepath.Join(h.dir, "audit-head")); string(got) != second.Attestation.String() {
		t.Fatalf("audit head %s, want %s", got, second.Attestation)
	}
	// A restarted signer continues the chain.
	again, err := NewSigner(h.key, filepath.Join(h.dir, "audit-head"))
	if err != nil || again.Head() == nil || *again.Head() != second.Attestation {
		t.Fatalf("restarted signer: %v %v", again.Head(), err)
	}
}

func mustCanon(t *testing.T, rc attest.Receipt) []byte {
	b, err := rc.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A refused append records nothing, and says why: here the run was closed
// while the interval ran. The metering is over (Ended), the mark stays for
// the interval the caller opens next, and the attestation, signed but
// named by no segment, is a root the audit chain still resolves.
func TestEndRefusedAppendRecordsNothing(t *testing.T) {
	h := newHost(t)
	cfg := h.run(t, "r")
	iv := Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(time.Now().UnixNano(), cfg.Output), "started")
	if err := iv.Save(); err != nil {
		t.Fatal(err)
	}
	g, _ := h.st.Head("r")
	if _, err := h.st.Append("r", g, record.Closure("closed meanwhile")); err != nil {
		t.Fatal(err)
	}
	before, _ := h.st.Run("r")
	_, err := iv.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Killed}, Then: []record.Segment{record.Closure("again")}})
	if !errors.Is(err, record.ErrClosed) || errors.Is(err, ErrSeal) {
		t.Fatalf("end after close: %v, want the record's refusal", err)
	}
	after, _ := h.st.Run("r")
	if after.Head != before.Head || after.Len != before.Len {
		t.Fatal("a refused end changed the record")
	}
	if !iv.Ended() {
		t.Fatal("the interval's metering is over, but Ended says not")
	}
	if _, ok := LoadMark(cfg.MarkPath); !ok {
		t.Fatal("a refused end dropped the mark")
	}
	head := h.signer.Head()
	if head == nil || !h.st.Has(*head) {
		t.Fatal("the signed attestation is not kept")
	}
	if _, err := iv.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Killed}}); !errors.Is(err, ErrSeal) {
		t.Fatalf("a second end: %v", err)
	}
}

// The head moves between the sealing and the append (another writer):
// the append is refused, never chained onto a head the attestation does
// not name.
func TestEndRefusedWhenTheHeadMoved(t *testing.T) {
	h := newHost(t)
	cfg := h.run(t, "r")
	iv := Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(time.Now().UnixNano(), cfg.Output), "started")
	env := h.env()
	env.Sealed = func() {
		// Another writer ends an interval of the same run first.
		other := Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(time.Now().UnixNano(), cfg.Output), "other")
		if _, err := other.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Running}}); err != nil {
			t.Error(err)
		}
	}
	_, err := iv.End(t.Context(), env, Ending{Outcome: attest.Outcome{Kind: attest.Running}})
	if !errors.Is(err, store.ErrHeadMoved) {
		t.Fatalf("end after the head moved: %v", err)
	}
	if st, _ := h.st.Run("r"); st.Len != 1 {
		t.Fatalf("%d segments, want the other writer's one", st.Len)
	}
}

// Sealing fails (the store refuses an object): nothing is appended, the
// audit head does not move, and the error says the sealing failed.
func TestEndSealFailureRecordsNothing(t *testing.T) {
	h := newHost(t)
	cfg := h.run(t, "r")
	iv := Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(time.Now().UnixNano(), cfg.Output), "started")
	full := errors.New("no space left on device")
	_, err := iv.End(t.Context(), Env{Store: &faultyStore{Store: h.st, failPut: full}, Signer: h.signer}, Ending{Outcome: attest.Outcome{Kind: attest.Running}})
	if !errors.Is(err, ErrSeal) || !errors.Is(err, full) {
		t.Fatalf("end with a failing store: %v", err)
	}
	if st, _ := h.st.Run("r"); st.Len != 0 || h.signer.Head() != nil {
		t.Fatal("a failed seal recorded something")
	}
	// An append the store fails after sealing: the signer moved on, the
	// record did not.
	iv = Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(time.Now().UnixNano(), cfg.Output), "restarted")
	broken := errors.New("disk gone")
	_, err = iv.End(t.Context(), Env{Store: &faultyStore{Store: h.st, failAppend: broken}, Signer: h.signer}, Ending{Outcome: attest.Outcome{Kind: attest.Running}})
	if !errors.Is(err, broken) || errors.Is(err, ErrSeal) {
		t.Fatalf("end with a failing append: %v", err)
	}
	if st, _ := h.st.Run("r"); st.Len != 0 || h.signer.Head() == nil {
		t.Fatal("append failure: record or audit chain wrong")
	}
}

// An interval the meter cannot follow gets an estimated receipt saying
// why; output discarded past the log limit is noted in the journal.
func TestEndUnmeteredAndDiscarded(t *testing.T) {
	h := newHost(t)
	cfg := h.run(t, "r")
	sb := &fakeSandbox{out: 10}
	m := MarkAt(time.Now().UnixNano(), cfg.Output)
	m.Discarded = [2]uint64{10, 0} // a sandbox that had an interval before
	iv := Begin(cfg, sb, fakeMeter{noCgroup: errors.New("no cgroup")}, m, "started")
	sb.out, sb.err = 110, 5
	sealed, err := iv.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Running}})
	if err != nil {
		t.Fatal(err)
	}
	if rc := sealed.Receipt; rc.Provenance != record.Estimated || rc.Method != "unmetered" || !strings.Contains(rc.Inputs["fallback"], "no cgroup") {
		t.Fatalf("receipt %+v", rc)
	}
	found := false
	for _, e := range h.journal(t, h.body(t, sealed.Attestation).Journal).Entries {
		found = found || string(e.Data) == `output-discarded {"stdout_bytes":100,"stderr_bytes":5,"limit_bytes":1048576}`
	}
	if !found {
		t.Fatal("the journal does not say what output was discarded")
	}
}

// A restarted daemon goes on with the saved interval: its start, its
// meter's CPU reading and its entries.
func TestReattachFromTheSavedMark(t *testing.T) {
	h := newHost(t)
	cfg := h.run(t, "r")
	start := time.Now().Add(-time.Hour).UnixNano()
	iv := Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(start, cfg.Output), "started")
	if err := iv.Save(); err != nil {
		t.Fatal(err)
	}
	again := Reattach(cfg, &fakeSandbox{}, fakeMeter{})
	if again.Start().UnixNano() != start || again.MeterErr() != nil {
		t.Fatalf("reattached at %v (%v)", again.Start(), again.MeterErr())
	}
	if ev := again.Events(); len(ev) != 2 || string(ev[0].Data) != "started" || string(ev[1].Data) != "reattached" {
		t.Fatalf("entries %v", ev)
	}
	sealed, err := again.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Running}})
	if err != nil || sealed.Receipt.CPUNS != 7 {
		t.Fatalf("end: %+v %v", sealed.Receipt, err)
	}
	// Without a mark: from now, and said so.
	fresh := Reattach(cfg, &fakeSandbox{}, fakeMeter{})
	if ev := fresh.Events(); len(ev) != 1 || !strings.Contains(string(ev[0].Data), "not saved") {
		t.Fatalf("entries without a mark %v", ev)
	}
}

// Intervals of many runs end at once: the audit chain stays one line
// (no two attestations share an audit_prev) and every record verifies.
func TestConcurrentEndsKeepOneAuditChain(t *testing.T) {
	h := newHost(t)
	const runs, each = 8, 5
	var wg sync.WaitGroup
	atts := make(chan record.Address, runs*each)
	for i := range runs {
		cfg := h.run(t, fmt.Sprintf("r%d", i))
		wg.Go(func() {
			for range each {
				iv := Begin(cfg, &fakeSandbox{}, fakeMeter{}, MarkAt(time.Now().UnixNano(), cfg.Output), "started")
				s, err := iv.End(context.Background(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Running}, Calls: &record.CallAccount{}})
				if err != nil {
					t.Error(err)
					return
				}
				atts <- s.Attestation
			}
		})
	}
	wg.Wait()
	close(atts)
	prevs := map[record.Address]bool{}
	firsts := 0
	for a := range atts {
		b := h.body(t, a)
		if b.AuditPrev == nil {
			firsts++
			continue
		}
		if prevs[*b.AuditPrev] {
			t.Fatalf("two attestations name %s as audit_prev", *b.AuditPrev)
		}
		prevs[*b.AuditPrev] = true
	}
	if firsts != 1 {
		t.Fatalf("%d attestations start the audit chain", firsts)
	}
}

// strayMeter meters with a receipt no provenance labels (a meter's bug):
// its canonical form is refused.
type strayMeter struct{ fakeMeter }

func (strayMeter) Begin(string) (Metering, error) { return strayMetering{}, nil }

type strayMetering struct{}

func (strayMetering) End() (attest.Receipt, error) {
	return attest.Receipt{Provenance: record.Provenance(0x7f), Method: "stray"}, nil
}

func (strayMetering) CPUAtBegin() uint64 { return 0 }

// Every step of the sealing End refuses before the append: the receipt's
// form, the journal, the run's state, its segments, the attestation, its
// root, the audit head's file. Each
// refusal is ErrSeal with its cause; the record is as it was, the audit
// head did not move, the store checks clean (its cleanup), the interval is
// over (Ended, a second End refused) and its mark is kept for the interval
// the caller opens next.
func TestEndRefusedBeforeTheAppend(t *testing.T) {
	failure := errors.New("the store fails")
	for name, c := range map[string]struct {
		meter     Meter
		store     func(*store.Store) Store
		auditHead string // the signer's, under the host's directory
		cause     error
	}{
		"receipt": {meter: strayMeter{}, cause: attest.ErrMalformed},
		"journal": {store: func(st *store.Store) Store { return &faultyStore{Store: st, failStream: failure} }},
		"run":     {store: func(st *store.Store) Store { return &faultyStore{Store: st, failRun: failure} }},
		"raw":     {store: func(st *store.Store) Store { return &faultyStore{Store: st, failRaw: failure} }},
		// The receipt is stored, the attestation is not.
		"attestation": {store: func(st *store.Store) Store { return &faultyStore{Store: st, failPut: failure, putBytesOK: 1} }},
		"root":        {store: func(st *store.Store) Store { return &faultyStore{Store: st, failRoot: failure} }},
		// The audit head's directory is a file by the time it is written.
		"audit-head": {auditHead: "file/audit-head", cause: syscall.ENOTDIR},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHost(t)
			cfg := h.run(t, "r")
			var meter Meter = fakeMeter{}
			if c.meter != nil {
				meter = c.meter
			}
			env := h.env()
			if c.store != nil {
				env.Store = c.store(h.st)
			}
			if c.auditHead != "" {
				s, err := NewSigner(h.key, filepath.Join(h.dir, c.auditHead))
				if err != nil {
					t.Fatal(err)
				}
				appendFile(t, filepath.Join(h.dir, filepath.Dir(c.auditHead)), "")
				env.Signer, h.signer = s, s
			}
			cause := c.cause
			if cause == nil {
				cause = failure
			}
			iv := Begin(cfg, &fakeSandbox{}, meter, MarkAt(time.Now().UnixNano(), cfg.Output), "started")
			if err := iv.Save(); err != nil {
				t.Fatal(err)
			}
			before, _ := h.st.Run("r")
			_, err := iv.End(t.Context(), env, Ending{Outcome: attest.Outcome{Kind: attest.Running}, Calls: &record.CallAccount{}})
			if !errors.Is(err, ErrSeal) || !errors.Is(err, cause) {
				t.Fatalf("end: %v, want %v and %v", err, ErrSeal, cause)
			}
			if after, _ := h.st.Run("r"); after.Head != before.Head || after.Len != before.Len || after.Phase != before.Phase {
				t.Fatalf("a refused end changed the record: %+v, was %+v", after, before)
			}
			if h.signer.Head() != nil {
				t.Fatal("a refused seal moved the audit head")
			}
			if _, err := os.Stat(filepath.Join(h.dir, "audit-head")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused seal wrote the audit head: %v", err)
			}
			if _, err := h.st.Check(t.Context()); err != nil {
				t.Fatalf("store check: %v", err)
			}
			if !iv.Ended() {
				t.Fatal("the interval's metering is over, but Ended says not")
			}
			if _, ok := LoadMark(cfg.MarkPath); !ok {
				t.Fatal("a refused end dropped the mark")
			}
			if _, err := iv.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Running}}); !errors.Is(err, ErrSeal) {
				t.Fatalf("a second end: %v", err)
			}
			if after, _ := h.st.Run("r"); after.Len != before.Len {
				t.Fatal("a second end recorded something")
			}
		})
	}
}

// The first interval of a new sandbox holds everything the sandbox
// discarded, from before Begin too (a unit that floods its output at once
// overruns its log limit before the interval opens); an interval begun on
// a sandbox that had one before counts from its mark's baseline.
func TestDiscardedFromTheSandboxStart(t *testing.T) {
	h := newHost(t)
	cfg := h.run(t, "r")
	sb := &fakeSandbox{err: 3 << 20}
	iv := Begin(cfg, sb, fakeMeter{noCgroup: errors.New("no cgroup")}, MarkAt(time.Now().UnixNano(), cfg.Output), "started")
	sb.err += 5
	sealed, err := iv.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Running}})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`output-discarded {"stdout_bytes":0,"stderr_bytes":%d,"limit_bytes":1048576}`, 3<<20+5)
	found := false
	for _, e := range h.journal(t, h.body(t, sealed.Attestation).Journal).Entries {
		found = found || string(e.Data) == want
	}
	if !found {
		t.Fatalf("the journal does not hold %s", want)
	}

	m := MarkAt(time.Now().UnixNano(), cfg.Output)
	m.Discarded = [2]uint64{sb.out, sb.err}
	iv = Begin(cfg, sb, fakeMeter{noCgroup: errors.New("no cgroup")}, m, "restarted")
	sb.out += 7
	sealed, err = iv.End(t.Context(), h.env(), Ending{Outcome: attest.Outcome{Kind: attest.Running}})
	if err != nil {
		t.Fatal(err)
	}
	want = `output-discarded {"stdout_bytes":7,"stderr_bytes":0,"limit_bytes":1048576}`
	found = false
	for _, e := range h.journal(t, h.body(t, sealed.Attestation).Journal).Entries {
		found = found || string(e.Data) == want
	}
	if !found {
		t.Fatalf("the second interval's journal does not hold %s", want)
	}
}
