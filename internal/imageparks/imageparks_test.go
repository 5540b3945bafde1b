package imageparks

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/testhost"
)

// prober is a scripted Prober: each probe takes the next outcome from
// outcomes, after release lets it go (when release is not nil).
type prober struct {
	outcomes chan criu.Probe
	release  chan struct{}
	calls    atomic.Int32
}

func (p *prober) probe(ctx context.Context) criu.Probe {
	p.calls.Add(1)
	if p.release != nil {
		select {
		case <-p.release:
		case <-ctx.Done():
			return criu.Probe{Reason: "stopped"}
		}
	}
	return <-p.outcomes
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// mustGate starts a gate over p with a settable clock; its cleanup stops
// the background and waits for every probe.
func mustGate(t *testing.T, p *prober, criuErr error) (*Gate, *clock) {
	t.Helper()
	bg, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		stop()
		wg.Wait()
	})
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	g := newGate(bg, &wg, p.probe, criuErr, testhost.Log(t))
	g.now = c.now
	g.start()
	return g, c
}

func outcomes(ps ...criu.Probe) chan criu.Probe {
	ch := make(chan criu.Probe, len(ps))
	for _, p := range ps {
		ch <- p
	}
	return ch
}

// A probe that dumps and restores opens the gate, with its notes.
func TestReadyProbeOK(t *testing.T) {
	p := &prober{outcomes: outcomes(criu.Probe{OK: true, Notes: []string{"hw breakpoints off"}, Took: time.Second})}
	g, _ := mustGate(t, p, nil)
	if err := g.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := Status{State: Available, Notes: []string{"hw breakpoints off"}, Took: time.Second}
	if got := g.Status(); got.State != want.State || got.Reason != "" || strings.Join(got.Notes, ",") != "hw breakpoints off" || got.Took != want.Took {
		t.Fatalf("status %+v, want %+v", got, want)
	}
	if got := g.Status().State.String(); got != "available" {
		t.Fatalf("state %q", got)
	}
}

// A failed probe keeps the gate closed with its reason; a request within
// ReprobeAfter does not probe again, one after it does, and a fixed host
// gets image parks back without a restart.
func TestReadyReprobesAfterInterval(t *testing.T) {
	p := &prober{outcomes: outcomes(criu.Probe{Reason: "criu: dump failed"}, criu.Probe{OK: true})}
	g, c := mustGate(t, p, nil)
	err := g.Ready(t.Context())
	if !errors.Is(err, ErrUnavailable) || err.Error() != "image parks are unavailable on this host: criu: dump failed" {
		t.Fatalf("ready: %v", err)
	}
	if s := g.Status(); s.State != Unavailable || s.Reason != "criu: dump failed" || s.State.String() != "unavailable" {
		t.Fatalf("status %+v", s)
	}
	c.advance(ReprobeAfter)
	if err := g.Ready(t.Context()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ready within the interval: %v", err)
	}
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("probed %d times within the interval", n)
	}
	c.advance(time.Nanosecond)
	if err := g.Ready(t.Context()); err != nil {
		t.Fatalf("ready after the reprobe: %v", err)
	}
	if n := p.calls.Load(); n != 2 {
		t.Fatalf("probed %d times", n)
	}
	// Open now: no more probes, however late.
	c.advance(time.Hour)
	if err := g.Ready(t.Context()); err != nil || p.calls.Load() != 2 {
		t.Fatalf("ready: %v after %d probes", err, p.calls.Load())
	}
}

// A request cancelled while the probe runs returns its context's error,
// not ErrUnavailable; Status says probing meanwhile; the probe goes on and
// the next request gets its outcome.
func TestReadyCancelWhileProbing(t *testing.T) {
	p := &prober{outcomes: outcomes(criu.Probe{OK: true}), release: make(chan struct{})}
	g, _ := mustGate(t, p, nil)
	if s := g.Status(); s.State != Probing || s.State.String() != "probing" || s.Reason != "" || s.Notes != nil {
		t.Fatalf("status while probing: %+v", s)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := g.Ready(ctx)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) || !strings.HasPrefix(err.Error(), "waiting for the image-park probe: ") {
		t.Fatalf("ready: %v", err)
	}
	close(p.release)
	if err := g.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A CRIU that did not tell its version is never probed: the gate is closed
// with that as the reason, and stays closed however late one asks.
func TestReadyCRIUErrNeverProbes(t *testing.T) {
	p := &prober{outcomes: outcomes()}
	g, c := mustGate(t, p, errors.New("criu: executable file not found in $PATH"))
	for range 2 {
		err := g.Ready(t.Context())
		if !errors.Is(err, ErrUnavailable) || !strings.HasSuffix(err.Error(), ": criu: executable file not found in $PATH") {
			t.Fatalf("ready: %v", err)
		}
		c.advance(2 * ReprobeAfter)
	}
	if n := p.calls.Load(); n != 0 {
		t.Fatalf("probed %d times", n)
	}
	if s := g.Status(); s.State != Unavailable || s.Reason != "criu: executable file not found in $PATH" {
		t.Fatalf("status %+v", s)
	}
}

// A daemon stopping does not start a reprobe.
func TestReadyNoReprobeWhenStopping(t *testing.T) {
	p := &prober{outcomes: outcomes(criu.Probe{Reason: "broken"})}
	bg, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	g := newGate(bg, &wg, p.probe, nil, testhost.Log(t))
	g.now = c.now
	g.start()
	if err := g.Ready(t.Context()); !errors.Is(err, ErrUnavailable) {
		t.Fatal(err)
	}
	stop()
	c.advance(2 * ReprobeAfter)
	if err := g.Ready(t.Context()); !errors.Is(err, ErrUnavailable) {
		t.Fatal(err)
	}
	wg.Wait()
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("probed %d times", n)
	}
}

// The CRIU deadline is the configured one, or 30 s plus a second per
// 64 MiB moved.
func TestDeadline(t *testing.T) {
	for mem, want := range map[uint64]time.Duration{0: 30 * time.Second, 64<<20 - 1: 30 * time.Second, 512 << 20: 38 * time.Second, 8 << 30: 158 * time.Second} {
		if got := Deadline(0, mem); got != want {
			t.Errorf("deadline for %d bytes: %v, want %v", mem, got, want)
		}
	}
	if got := Deadline(3*time.Second, 8<<30); got != 3*time.Second {
		t.Errorf("configured deadline: %v", got)
	}
}

// Admit lets Slots dumps or restores in at once: the next waits until
// one is released (a second release frees nothing more), a wait ends with
// its context, and a closed gate admits none.
func TestAdmitSlots(t *testing.T) {
	p := &prober{outcomes: outcomes(criu.Probe{OK: true})}
	g, _ := mustGate(t, p, nil)
	var releases []func()
	for range Slots() {
		release, err := g.Admit(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := g.Admit(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("admitted past the slots: %v", err)
	}
	admitted := make(chan func())
	go func() {
		release, err := g.Admit(context.Background())
		if err != nil {
			t.Error(err)
		}
		admitted <- release
	}()
	select {
	case <-admitted:
		t.Fatal("admitted before a slot was released")
	case <-time.After(50 * time.Millisecond):
	}
	releases[0]()
	releases[0]() // once only
	last := <-admitted
	short2, cancel2 := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel2()
	if _, err := g.Admit(short2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second release freed a second slot: %v", err)
	}
	last()
	for _, r := range releases[1:] {
		r()
	}

	closed, _ := mustGate(t, &prober{outcomes: outcomes(criu.Probe{Reason: "broken"})}, nil)
	if _, err := closed.Admit(t.Context()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a closed gate: %v", err)
	}
}

// Slots is one per processor the daemon may use, at least two.
func TestSlots(t *testing.T) {
	if got, want := Slots(), max(2, runtime.GOMAXPROCS(0)); got != want {
		t.Fatalf("slots %d, want %d", got, want)
	}
}

// Expect finds the slots crowded once those held, those waited for and
// the restores expected before it reach Slots; an ended expectation (a
// second done changes nothing) or a released slot makes room again. A
// nil gate is never crowded.
func TestExpectCrowded(t *testing.T) {
	p := &prober{outcomes: outcomes(criu.Probe{OK: true})}
	g, _ := mustGate(t, p, nil)
	if err := g.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	release, err := g.Admit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var dones []func()
	for i := 1; i < Slots(); i++ {
		crowded, done := g.Expect()
		if crowded {
			t.Fatalf("expectation %d with 1 slot held of %d: crowded", i, Slots())
		}
		dones = append(dones, done)
	}
	crowded, done := g.Expect()
	if !crowded {
		t.Fatalf("%d slot held and %d expected of %d: not crowded", 1, len(dones), Slots())
	}
	done()
	done()
	release()
	if crowded, _ := g.Expect(); crowded {
		t.Fatalf("%d expected of %d, none held: crowded", len(dones), Slots())
	}
	if crowded, _ := (*Gate)(nil).Expect(); crowded {
		t.Fatal("a nil gate: crowded")
	}
}
