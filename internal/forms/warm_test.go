package forms

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// fakeCreator makes sandboxes created and not started.
type fakeCreator struct {
	box     *fakeBox
	mu      sync.Mutex
	created map[string]executor.Spec
}

type fakeCreated struct {
	*fakeUnit
	begun int
}

func (c *fakeCreator) Create(_ context.Context, id string, spec executor.Spec, _ executor.Output) (Created, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.created[id] = spec
	return &fakeCreated{fakeUnit: &fakeUnit{box: c.box, id: id, status: "created"}}, nil
}

func (u *fakeCreated) Begin(context.Context) error {
	u.begun++
	return u.set("running")
}

func (u *fakeCreated) Resident(context.Context) (uint64, bool, error) { return 4 << 20, true, nil }

// parkedTranscript starts run r, takes its snapshot and closes its
// channel, as a recorded park leaves it.
func parkedTranscript(t *testing.T, h Env, r Run) record.Snapshot {
	t.Helper()
	f := h.Transcript()
	w, err := f.Start(t.Context(), stored(t, h, r))
	if err != nil {
		t.Fatal(err)
	}
	release := w.Unit.Hold()
	taken, err := f.Snapshot(t.Context(), w.Unit)
	release()
	if err != nil {
		t.Fatal(err)
	}
	w.Unit.Close()
	return taken.Snapshot
}

// A warm sandbox is the one Wake would make — the same id, spec and
// channel directory, with the sealed transcript in it — created and not
// started; a Wake given it starts it, and makes nothing.
func TestWarmWakeStartsThePreparedSandbox(t *testing.T) {
	h, box := testHost(t, nil)
	cr := &fakeCreator{box: box, created: map[string]executor.Spec{}}
	snap := parkedTranscript(t, h, transcriptRun("r"))
	cold := box.started["r_t1"]
	delete(box.started, "r_t1")

	warm, err := h.Transcript().Prepare(t.Context(), transcriptRun("r"), snap, cr)
	if err != nil {
		t.Fatal(err)
	}
	if warm.Sandbox() != "r_t1" || warm.Run() != "r" || !reflect.DeepEqual(cr.created["r_t1"], cold) {
		t.Fatalf("warm %s of %s, spec %+v, want %+v", warm.Sandbox(), warm.Run(), cr.created["r_t1"], cold)
	}
	if n, err := warm.Resident(t.Context()); err != nil || n != 4<<20 {
		t.Fatalf("resident %d %v", n, err)
	}
	sealed, err := h.Store.ReadAll(*snap.Transcript)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(calls.ChannelDir(h.StateDir, "r"), protocol.TranscriptFile))
	if err != nil || !bytes.Equal(got, sealed) {
		t.Fatalf("transcript %q (%v), want %q", got, err, sealed)
	}
	sb := warm.sb.(*fakeCreated)
	if status(t, sb) != "created" {
		t.Fatal("a warm sandbox was started before its wake")
	}

	woke, err := h.Transcript().Wake(t.Context(), transcriptRun("r"), Waking{Snapshot: snap, Warm: warm})
	if err != nil {
		t.Fatal(err)
	}
	defer woke.Unit.Close()
	if !woke.Warm || woke.Unit.Sandbox != Sandbox(sb) || sb.begun != 1 || status(t, sb) != "running" || woke.Event != "resumed" {
		t.Fatalf("woken %+v, begun %d", woke, sb.begun)
	}
	if woke.Unit.Channel() == nil || len(box.started) != 0 {
		t.Fatalf("channel %v, started %v", woke.Unit.Channel(), box.started)
	}
}

// A warm sandbox that is not the one this wake would make — another
// transcript, another grant set, another run — is discarded, and the wake
// makes its sandbox as without one.
func TestWarmWakeRefusesAStaleSandbox(t *testing.T) {
	for name, change := range map[string]func(*Run){
		"transcript": nil, // the wake resumes another transcript
		"grants":     func(r *Run) { r.Grants.Limits = unit.Limits{TranscriptBytes: 1 << 30} },
		"unit":       func(r *Run) { r.Spec.Args = []string{"/other"} },
	} {
		t.Run(name, func(t *testing.T) {
			h, box := testHost(t, nil)
			cr := &fakeCreator{box: box, created: map[string]executor.Spec{}}
			snap := parkedTranscript(t, h, transcriptRun("r"))
			delete(box.started, "r_t1")
			warm, err := h.Transcript().Prepare(t.Context(), transcriptRun("r"), snap, cr)
			if err != nil {
				t.Fatal(err)
			}
			run := transcriptRun("r")
			if change != nil {
				change(&run)
			} else {
				a, err := h.Store.PutBytes([]byte("another transcript"))
				if err != nil {
					t.Fatal(err)
				}
				snap = record.TranscriptSnapshot(a)
			}
			woke, err := h.Transcript().Wake(t.Context(), run, Waking{Snapshot: snap, Warm: warm})
			if err != nil {
				t.Fatal(err)
			}
			defer woke.Unit.Close()
			sb := warm.sb.(*fakeCreated)
			if woke.Warm || sb.begun != 0 || status(t, sb) != "stopped" {
				t.Fatalf("a stale warm sandbox was used: warm %v, begun %d, %s", woke.Warm, sb.begun, status(t, sb))
			}
			if _, ok := box.started["r_t1"]; !ok || woke.Unit.Sandbox.ID() != "r_t1" {
				t.Fatalf("the wake did not make its own sandbox: %v", box.started)
			}
		})
	}
}

// Pending: a run with a call outstanding may be woken by a posted result.
func TestPending(t *testing.T) {
	h, _ := testHost(t, nil)
	stored(t, h, transcriptRun("r"))
	if h.Pending("r") || h.Pending("none") {
		t.Fatal("pending without calls")
	}
}
