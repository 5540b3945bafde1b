package daemon

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// fakeExec is containerd and CRIU in memory: the daemon's Sandboxes for
// unit tests of its ordering and refusal logic (no root). A checkpoint
// writes an image directory and a rw-layer tar naming the sandbox and the
// checkpoint's ordinal; a restore reads them back and fails unless they
// are the ones that checkpoint wrote.
type fakeExec struct {
	mu     sync.Mutex
	sbs    map[string]*fakeSB
	images map[string]string // name → digest
	next   int               // checkpoints taken, for their contents
	// Failures to inject.
	checkpointErr error
	restoreErr    error
	startErr      error
	starts        int
	restores      []string        // what each restore read from the image directory
	specs         []executor.Spec // each start's and restore's spec
	// pages gets each lazy restore's pages (RestoreLazy, lazy_test.go).
	pages chan *fakePages
	// onPause, when set, runs as a sandbox is paused, before it is;
	// pauseErr, when set, is every pause's error (the unit unfrozen).
	onPause  func(id string)
	pauseErr error
	// onCheckpoint, when set, runs as a checkpoint of a sandbox starts.
	onCheckpoint func(id string)
	// prefetches counts Prefetch calls (forms.Admit, image resumes).
	prefetches atomic.Int32
	// taskless are containers whose task is gone (dropTask): listed, not
	// loaded, removed by Remove.
	taskless map[string]bool
}

// dropTask does to sandbox id what a host's restart does: its unit and
// task gone, its container kept.
func (x *fakeExec) dropTask(t *testing.T, id string) {
	t.Helper()
	if err := x.sandbox(id).Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.taskless == nil {
		x.taskless = map[string]bool{}
	}
	x.taskless[id] = true
}

// Prefetch is executor.Client.Prefetch: here, only counted.
func (x *fakeExec) Prefetch() { x.prefetches.Add(1) }

const (
	fakeImage  = "example/unit:1"
	fakeDigest = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
)

func newFakeExec() *fakeExec {
	return &fakeExec{sbs: map[string]*fakeSB{}, images: map[string]string{fakeImage: fakeDigest}}
}

// fakeSB is one sandbox: a unit whose status is all there is of it.
type fakeSB struct {
	ex      *fakeExec
	id      string
	mu      sync.Mutex
	status  string // running, paused, stopped
	exit    chan struct{}
	code    uint32
	settles int
	gone    bool
}

func (x *fakeExec) add(id string) (*fakeSB, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.sbs[id]; ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, executor.ErrExists)
	}
	sb := &fakeSB{ex: x, id: id, status: "running", exit: make(chan struct{})}
	x.sbs[id] = sb
	return sb, nil
}

func (x *fakeExec) sandbox(id string) *fakeSB {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.sbs[id]
}

func (x *fakeExec) Start(_ context.Context, id string, spec executor.Spec, _ executor.Output) (Sandbox, error) {
	x.mu.Lock()
	x.starts++
	x.specs = append(x.specs, spec)
	err := x.startErr
	x.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return x.add(id)
}

func (x *fakeExec) Restore(_ context.Context, id string, spec executor.Spec, cp executor.Checkpoint, _ executor.Output) (Sandbox, executor.RestoreStats, error) {
	x.mu.Lock()
	x.specs = append(x.specs, spec)
	err := x.restoreErr
	x.mu.Unlock()
	if err != nil {
		return nil, executor.RestoreStats{}, err
	}
	core, err := os.ReadFile(filepath.Join(cp.ImageDir, "core-1.img"))
	if err != nil {
		return nil, executor.RestoreStats{}, fmt.Errorf("%w: %v", executor.ErrRestore, err)
	}
	layer, err := os.ReadFile(cp.Rootfs)
	if err != nil || !strings.HasPrefix(string(layer), string(core)) {
		return nil, executor.RestoreStats{}, fmt.Errorf("%w: the rw layer is not the checkpoint's (%v)", executor.ErrRestore, err)
	}
	x.mu.Lock()
	x.restores = append(x.restores, string(core))
	x.mu.Unlock()
	sb, err := x.add(id)
	return sb, executor.RestoreStats{}, err
}

func (x *fakeExec) Load(_ context.Context, id string) (Sandbox, error) {
	if sb := x.sandbox(id); sb != nil {
		return sb, nil
	}
	return nil, fmt.Errorf("sandbox %s: %w", id, executor.ErrNotFound)
}

func (x *fakeExec) List(context.Context) ([]string, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var ids []string
	for id := range x.sbs {
		ids = append(ids, id)
	}
	for id := range x.taskless {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

func (x *fakeExec) Remove(ctx context.Context, id string) error {
	x.mu.Lock()
	delete(x.taskless, id)
	x.mu.Unlock()
	if sb := x.sandbox(id); sb != nil {
		return sb.Destroy(ctx)
	}
	return nil
}

func (x *fakeExec) Prune(context.Context) ([]string, error) { return nil, nil }

func (x *fakeExec) Image(_ context.Context, name string) (executor.Image, error) {
	if d, ok := x.images[name]; ok {
		return executor.Image{Name: name, Digest: d}, nil
	}
	return executor.Image{}, fmt.Errorf("image %s: %w", name, executor.ErrNotFound)
}

func (x *fakeExec) Import(context.Context, io.Reader, string) (executor.Image, error) {
	return executor.Image{}, errors.New("fake executor: no imports")
}

func (x *fakeExec) Versions(context.Context) (executor.Versions, error) {
	return executor.Versions{Containerd: "1.6.20~ds1", Runc: "1.1.5", CRIU: "4.2.1"}, nil
}

func (x *fakeExec) Probe(context.Context, time.Duration) criu.Probe {
	return criu.Probe{OK: true}
}

func (x *fakeExec) SweepProbes(context.Context) {}

func (x *fakeExec) Close() error { return nil }

func (s *fakeSB) ID() string                { return s.id }
func (s *fakeSB) Pid() uint32               { return 1 }
func (s *fakeSB) Omitted() (uint64, uint64) { return 0, 0 }
func (s *fakeSB) Stats(context.Context) (executor.Usage, error) {
	return executor.Usage{MemoryBytes: 1 << 20}, nil
}

func (s *fakeSB) Status(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status, nil
}

func (s *fakeSB) set(status string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return fmt.Errorf("sandbox %s: %w", s.id, executor.ErrNotFound)
	}
	s.status = status
	return nil
}

func (s *fakeSB) Pause(context.Context) error {
	s.ex.mu.Lock()
	hook, perr := s.ex.onPause, s.ex.pauseErr
	s.ex.mu.Unlock()
	if hook != nil {
		hook(s.id)
	}
	if perr != nil {
		return perr
	}
	return s.set("paused")
}

func (s *fakeSB) Resume(context.Context) error { return s.set("running") }

func (s *fakeSB) Settle(context.Context) error {
	s.mu.Lock()
	s.settles++
	s.mu.Unlock()
	return s.set("running")
}

func (s *fakeSB) Wait(ctx context.Context) (uint32, error) {
	select {
	case <-s.exit:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.code, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// exitWith ends the unit by itself with code.
func (s *fakeSB) exitWith(code uint32) {
	s.mu.Lock()
	s.status, s.code = "stopped", code
	s.mu.Unlock()
	close(s.exit)
}

func (s *fakeSB) Checkpoint(_ context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error) {
	s.ex.mu.Lock()
	err, hook := s.ex.checkpointErr, s.ex.onCheckpoint
	s.ex.next++
	n := s.ex.next
	s.ex.mu.Unlock()
	if hook != nil {
		hook(s.id)
	}
	if err != nil {
		return executor.CheckpointStats{}, err
	}
	if err := s.set("paused"); err != nil { // Keep: left frozen
		return executor.CheckpointStats{}, err
	}
	core := fmt.Sprintf("core of %s, checkpoint %d", s.id, n)
	if err := os.MkdirAll(cp.ImageDir, 0o700); err != nil {
		return executor.CheckpointStats{}, err
	}
	for name, data := range map[string]string{"core-1.img": core, "pages-1.img": strings.Repeat("p", 4096*n)} {
		if err := os.WriteFile(filepath.Join(cp.ImageDir, name), []byte(data), 0o600); err != nil {
			return executor.CheckpointStats{}, err
		}
	}
	if err := os.WriteFile(cp.Rootfs, []byte(core+" (rw layer)"), 0o600); err != nil {
		return executor.CheckpointStats{}, err
	}
	return executor.CheckpointStats{PagesWritten: uint64(n)}, nil
}

// Kill stops the unit, keeping its sandbox (Destroy removes it).
func (s *fakeSB) Kill(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone || s.status == "stopped" {
		return nil
	}
	s.status = "stopped"
	if s.code == 0 {
		s.code = 137
	}
	close(s.exit)
	return nil
}

func (s *fakeSB) Destroy(context.Context) error {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return nil
	}
	s.gone, s.status = true, "stopped"
	if s.code == 0 {
		s.code = 137
	}
	select {
	case <-s.exit:
	default:
		close(s.exit)
	}
	s.mu.Unlock()
	s.ex.mu.Lock()
	delete(s.ex.sbs, s.id)
	s.ex.mu.Unlock()
	return nil
}

// fakeHost is a daemon over a real store, a real meter on internal/idle's host
// tree, a real signer, and the fake executor. Its cleanup stops the
// daemon's goroutines and checks every record from genesis and every
// attestation at its place (mustMetricsHost's cleanup and this one).
type fakeHost struct {
	d  *Daemon
	ex *fakeExec
}

// newFakeHost opens the host; each of set changes its daemon before any
// goroutine of it runs.
func newFakeHost(t *testing.T, set ...func(*Daemon)) *fakeHost {
	t.Helper()
	h := mustMetricsHost(t, "")
	d := h.d
	d.cfg.StateDir = t.TempDir()
	d.runs = &runTable{st: d.st}
	key := ed25519.NewKeyFromSeed([]byte(strings.Repeat("k", 32)))
	s, err := interval.NewSigner(key, filepath.Join(d.cfg.StateDir, "audit-head"))
	if err != nil {
		t.Fatal(err)
	}
	d.signer, d.keyID = s, s.KeyID()
	d.host, err = manifest.Host("/proc/cpuinfo", manifest.Manifest{
		manifest.CRIUVersion: "4.2.1", manifest.RuncVersion: "1.1.5", manifest.ContainerdVersion: "1.6.20~ds1"})
	if err != nil {
		t.Fatal(err)
	}
	ex := newFakeExec()
	d.ex = ex
	for _, f := range set {
		f(d)
	}
	d.bgCtx, d.stop = context.WithCancel(context.Background())
	startProbe(d) // the fake's probe passes
	d.wire()
	t.Cleanup(func() {
		d.stop()
		d.bg.Wait()
		ids, err := d.st.AllRuns()
		if err != nil {
			t.Error(err)
		}
		for _, id := range ids {
			rec, err := d.st.Record(id)
			if err != nil {
				continue // mustMetricsHost's cleanup reports it
			}
			if _, err := attest.CheckRecord(rec, d.st.ReadAll, nil); err != nil {
				t.Errorf("cleanup: run %s: an attestation out of place: %v", id, err)
			}
		}
		if _, err := d.st.Check(context.Background()); err != nil {
			t.Errorf("cleanup: store check: %v", err)
		}
	})
	return &fakeHost{d: d, ex: ex}
}

// start starts an image-mode run id.
func (h *fakeHost) start(t *testing.T, id string) answers.Summary {
	t.Helper()
	r, err := h.d.Start(t.Context(), id, unit.Spec{Image: fakeImage, Args: []string{"/unit"}}, unit.Grants{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// kinds is the run's segments' kinds, space-separated.
func (h *fakeHost) kinds(t *testing.T, id string) string {
	t.Helper()
	raw, err := h.d.st.Raw(id)
	if err != nil {
		t.Fatal(err)
	}
	var ks []string
	for _, s := range raw.Segments {
		ks = append(ks, s.Kind.String())
	}
	return strings.Join(ks, " ")
}

// teardown waits for the sandbox of run id's last park to be destroyed.
func (h *fakeHost) teardown(t *testing.T, id string) {
	t.Helper()
	r := h.d.runs.peek(id)
	r.mu.Lock()
	done := r.teardown
	r.mu.Unlock()
	if done != nil {
		<-done
	}
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// startProbe starts d's image-park gate over its executor, as New does,
// without a CRIU build's record.
func startProbe(d *Daemon) {
	d.probe = imageparks.Start(d.bgCtx, &d.bg, probeFor(d.ex, criu.Build{}, d.cfg), nil, d.log)
	d.forms.Gate = d.probe
}

// openAttestation opens the attestation at a in st.
func openAttestation(st *store.Store, a record.Address) (*attest.Body, error) {
	b, err := st.ReadAll(a)
	if err != nil {
		return nil, err
	}
	return attest.Open(b, nil)
}
