package forms

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/protocol"
)

// fakeBox is containerd and CRIU in memory for the forms: a checkpoint
// writes an image directory and a rw layer naming the checkpoint, and a
// restore fails unless it reads them back.
type fakeBox struct {
	mu       sync.Mutex
	started  map[string]executor.Spec // sandbox id → its spec
	restored []string                 // what each restore read
	// restoreSpecs are the specs of the restores, in order.
	restoreSpecs []executor.Spec
	n            int
	pauseErr     error
	// checkpointErr, when set, refuses every checkpoint.
	checkpointErr error
}

type fakeUnit struct {
	box     *fakeBox
	id      string
	mu      sync.Mutex
	status  string
	settles int
}

func (b *fakeBox) Image(_ context.Context, name string) (executor.Image, error) {
	if name != "example/unit:1" {
		return executor.Image{}, fmt.Errorf("image %s: %w", name, executor.ErrNotFound)
	}
	return executor.Image{Name: name, Digest: "sha256:" + strings.Repeat("a", 64)}, nil
}

func (b *fakeBox) Start(_ context.Context, id string, spec executor.Spec, _ executor.Output) (Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.started[id] = spec
	return &fakeUnit{box: b, id: id, status: "running"}, nil
}

func (b *fakeBox) Restore(_ context.Context, id string, spec executor.Spec, cp executor.Checkpoint, _ executor.Output) (Sandbox, executor.RestoreStats, error) {
	core, err := os.ReadFile(filepath.Join(cp.ImageDir, "core-1.img"))
	if err != nil {
		return nil, executor.RestoreStats{}, fmt.Errorf("%w: %v", executor.ErrRestore, err)
	}
	if layer, err := os.ReadFile(cp.Rootfs); err != nil || !strings.HasPrefix(string(layer), string(core)) {
		return nil, executor.RestoreStats{}, fmt.Errorf("%w: the rw layer is not the checkpoint's", executor.ErrRestore)
	}
	if spec.Link != nil { // the namespace links out as CRIU sets it up
		if err := spec.Link("/restored"); err != nil {
			return nil, executor.RestoreStats{}, err
		}
	}
	b.mu.Lock()
	b.restored = append(b.restored, string(core))
	b.restoreSpecs = append(b.restoreSpecs, spec)
	b.mu.Unlock()
	return &fakeUnit{box: b, id: id, status: "running"}, executor.RestoreStats{PagesRestored: 1}, nil
}

func (u *fakeUnit) ID() string                { return u.id }
func (u *fakeUnit) Pid() uint32               { return 1 }
func (u *fakeUnit) Omitted() (uint64, uint64) { return 0, 0 }
func (u *fakeUnit) Wait(ctx context.Context) (uint32, error) {
	<-ctx.Done()
	return 0, ctx.Err()
}
func (u *fakeUnit) Stats(context.Context) (executor.Usage, error) {
	return executor.Usage{MemoryBytes: 1 << 20}, nil
}
func (u *fakeUnit) Destroy(context.Context) error { return u.set("stopped") }

func (u *fakeUnit) Kill(context.Context) error { return u.set("stopped") }

func (u *fakeUnit) Status(context.Context) (string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.status, nil
}

func (u *fakeUnit) set(s string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.status = s
	return nil
}

func (u *fakeUnit) Pause(context.Context) error {
	if err := u.box.pauseErr; err != nil {
		return err
	}
	return u.set("paused")
}

func (u *fakeUnit) Resume(context.Context) error { return u.set("running") }

func (u *fakeUnit) Settle(context.Context) error {
	u.mu.Lock()
	u.settles++
	u.mu.Unlock()
	return u.set("running")
}

func (u *fakeUnit) Checkpoint(_ context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error) {
	if err := u.box.checkpointErr; err != nil {
		return executor.CheckpointStats{}, err
	}
	u.box.mu.Lock()
	u.box.n++
	n := u.box.n
	u.box.mu.Unlock()
	if err := u.set("paused"); err != nil {
		return executor.CheckpointStats{}, err
	}
	core := fmt.Sprintf("core of %s, checkpoint %d", u.id, n)
	if err := os.MkdirAll(cp.ImageDir, 0o700); err != nil {
		return executor.CheckpointStats{}, err
	}
	if err := os.WriteFile(filepath.Join(cp.ImageDir, "core-1.img"), []byte(core), 0o600); err != nil {
		return executor.CheckpointStats{}, err
	}
	return executor.CheckpointStats{PagesWritten: 1}, os.WriteFile(cp.Rootfs, []byte(core+" (rw layer)"), 0o600)
}

// testHost is an Env over a real store, the fake box and a gate whose
// probe passes unless criuErr is set.
func testHost(t *testing.T, criuErr error) (Env, *fakeBox) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	log := slog.New(slog.DiscardHandler)
	gate := imageparks.Start(ctx, &wg, func(context.Context) criu.Probe { return criu.Probe{OK: true} }, criuErr, log)
	box := &fakeBox{started: map[string]executor.Spec{}}
	dir := t.TempDir()
	ih := interval.Recorder{StateDir: dir}
	h := Env{Store: st, Sandboxes: box, StateDir: dir, Gate: gate, Calls: nopCalls{}, Invalid: errInvalid, Log: log,
		Output: func(run string) (executor.Output, error) { return executor.Output(ih.Output(run)), nil },
		Mark:   ih.MarkNow}
	return h, box
}

var errInvalid = errors.New("invalid request")

type nopCalls struct{}

func (nopCalls) Dispatched(string, protocol.Call) {}
func (nopCalls) Awaiting(string, *calls.Channel)  {}

// stored stores run r's genesis, as a run's start does.
func stored(t *testing.T, h Env, r Run) Run {
	t.Helper()
	u, err := h.Store.PutBytes([]byte(r.ID + " unit"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := h.Store.PutBytes([]byte(r.ID + " grants"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store.Create(r.ID, u, g); err != nil {
		t.Fatal(err)
	}
	return r
}
