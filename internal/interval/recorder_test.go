package interval

import (
	"bytes"
	"crypto/ed25519"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/testhost"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// pidSandbox is a sandbox whose unit is the process pid of internal/idle's
// host tree: 4243 has a (v2) cgroup the meter reads, 1 none.
type pidSandbox struct{ pid uint32 }

func (s pidSandbox) Pid() uint32               { return s.pid }
func (s pidSandbox) Omitted() (uint64, uint64) { return 0, 0 }

// syncBuffer is a log's buffer, safe to write from any goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// newTestHost is a Recorder over a real store and a real meter on internal/idle's
// host tree (internal/testhost), a signer, and a state directory; what it
// logs is in the buffer.
func newTestHost(t *testing.T) (Recorder, *testhost.Fixture, *syncBuffer) {
	t.Helper()
	th := testhost.New(t, "")
	dir := t.TempDir()
	s, err := NewSigner(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, 32)), filepath.Join(dir, "audit-head"))
	if err != nil {
		t.Fatal(err)
	}
	log := &syncBuffer{}
	return Recorder{StateDir: dir, Store: th.Store, Signer: s, Meter: IdleMeter{M: th.Meter}, Log: slog.New(slog.NewTextHandler(log, nil))}, th, log
}

// A run keeps its output and its mark under runs/<id>/, and its
// interval's log limit is the granted one, or the default when unset.
func TestHostLayout(t *testing.T) {
	h := Recorder{StateDir: "/state"}
	if o := h.Output("r"); o != (Output{Stdout: "/state/runs/r/stdout", Stderr: "/state/runs/r/stderr"}) {
		t.Errorf("Output = %+v", o)
	}
	if p := h.MarkPath("r"); p != "/state/runs/r/interval.json" {
		t.Errorf("MarkPath = %s", p)
	}
	if c := h.config("r", unit.Limits{}); c.LogLimit != unit.DefaultLimits.LogBytes || c.Run != "r" || c.MarkPath != h.MarkPath("r") || c.Output != h.Output("r") {
		t.Errorf("config with no limits = %+v", c)
	}
	if c := h.config("r", unit.Limits{LogBytes: 77}); c.LogLimit != 77 {
		t.Errorf("config with a log limit of 77 = %+v", c)
	}
}

// MarkNow marks the run's output where it ends now.
func TestHostMarkNow(t *testing.T) {
	h := Recorder{StateDir: t.TempDir()}
	if m := h.MarkNow("r"); m.OutOff != 0 || m.ErrOff != 0 || m.StartNS == 0 {
		t.Fatalf("mark with no output = %+v", m)
	}
	out := h.Output("r")
	if err := os.MkdirAll(filepath.Dir(out.Stdout), 0o700); err != nil {
		t.Fatal(err)
	}
	appendFile(t, out.Stdout, "12345")
	appendFile(t, out.Stderr, "12")
	if m := h.MarkNow("r"); m.OutOff != 5 || m.ErrOff != 2 {
		t.Fatalf("mark after 5 and 2 bytes = %+v", m)
	}
}

// An interval begun, saved, reattached by a restarted daemon and ended
// through the Recorder: metered from its start, its mark kept until the end
// and dropped by it, the hook run once between the sealing and the
// append, and the record whole.
func TestHostBeginSaveReattachEnd(t *testing.T) {
	h, th, log := newTestHost(t)
	th.Start(t, "r")
	sb := pidSandbox{pid: 4243}
	iv := h.Begin("r", sb, unit.Limits{}, "started", h.MarkNow("r"))
	if err := iv.MeterErr(); err != nil {
		t.Fatalf("not metered: %v", err)
	}
	h.SaveMark(iv)
	m, ok := LoadMark(h.MarkPath("r"))
	if !ok || !m.Metered || len(m.Events) != 1 {
		t.Fatalf("saved mark %+v, %v", m, ok)
	}
	// A restarted daemon goes on from the saved mark.
	iv = h.Reattach("r", sb, unit.Limits{})
	if err := iv.MeterErr(); err != nil {
		t.Fatalf("reattached, not metered: %v", err)
	}
	if !iv.Start().Equal(time.Unix(0, m.StartNS)) || len(iv.Events()) != 2 {
		t.Fatalf("reattached at %v with %d events, want the mark's start and 2", iv.Start(), len(iv.Events()))
	}
	hooked := 0
	sealed, err := h.End(t.Context(), iv, func() {
		hooked++
		raw, err := th.Store.Raw("r")
		if err != nil || len(raw.Segments) != 0 || h.Signer.Head() == nil {
			t.Errorf("at the hook: %d segments, audit head %v, %v; want none yet, and a head", len(raw.Segments), h.Signer.Head(), err)
		}
	}, Ending{Outcome: attest.Outcome{Kind: attest.Running}, Calls: &record.CallAccount{}})
	if err != nil {
		t.Fatal(err)
	}
	if hooked != 1 {
		t.Fatalf("the hook ran %d times", hooked)
	}
	raw, err := th.Store.Raw("r")
	if err != nil || len(raw.Segments) != 1 || raw.Segments[0].Kind != record.Executed || raw.Segments[0].Attestation != *h.Signer.Head() || sealed.Head != raw.Head {
		t.Fatalf("record after End: %+v, %v", raw, err)
	}
	if _, ok := LoadMark(h.MarkPath("r")); ok {
		t.Fatal("the mark outlived the recorded interval")
	}
	if strings.Contains(log.String(), "level=WARN") {
		t.Fatalf("warnings: %s", log)
	}
}

// An interval the meter cannot meter (a process with no cgroup, a cgroup
// whose CPU time cannot be read) is begun all the same, with a warning
// naming the run; it ends with an estimated receipt, and a nil hook is
// none.
func TestHostBeginUnmetered(t *testing.T) {
	for _, pid := range []uint32{1, 4242} {
		h, th, log := newTestHost(t)
		th.Start(t, "r")
		iv := h.Begin("r", pidSandbox{pid: pid}, unit.Limits{}, "started", h.MarkNow("r"))
		if iv.MeterErr() == nil {
			t.Fatalf("pid %d: metered", pid)
		}
		if s := log.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, `msg="interval not metered from its start" run=r`) {
			t.Fatalf("pid %d: log: %s", pid, s)
		}
		sealed, err := h.End(t.Context(), iv, nil, Ending{Outcome: attest.Outcome{Kind: attest.Killed}})
		if err != nil {
			t.Fatal(err)
		}
		if sealed.Receipt.Provenance != record.Estimated {
			t.Fatalf("pid %d: receipt of an unmetered interval: %+v", pid, sealed.Receipt)
		}
	}
}

// A mark that cannot be saved is a warning, not a failure; DropMark
// removes a saved one.
func TestHostSaveAndDropMark(t *testing.T) {
	h, th, log := newTestHost(t)
	th.Start(t, "r")
	iv := h.Begin("r", pidSandbox{pid: 4243}, unit.Limits{}, "started", h.MarkNow("r"))
	h.SaveMark(iv)
	if _, ok := LoadMark(h.MarkPath("r")); !ok {
		t.Fatal("no mark saved")
	}
	h.DropMark("r")
	if _, err := os.Stat(h.MarkPath("r")); !os.IsNotExist(err) {
		t.Fatalf("mark after DropMark: %v", err)
	}
	// runs/r is a file: the mark's directory cannot be made.
	if err := os.RemoveAll(filepath.Join(h.StateDir, "runs", "r")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.StateDir, "runs", "r"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h.SaveMark(iv)
	if s := log.String(); !strings.Contains(s, `level=WARN msg="interval start not saved; a restarted daemon attests it from the restart" run=r`) {
		t.Fatalf("log: %s", s)
	}
}
