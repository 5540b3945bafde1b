package drain

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func host(n string) record.Address { return record.Sum([]byte(n)) }

// Transcript runs go first; runs spread over the hosts; a host that
// refuses a run passes it to the next; a run every host refuses stays,
// with every refusal; progress counts each outcome once.
func TestDrain(t *testing.T) {
	a, b := host("a"), host("b")
	refused := errors.New("manifest mismatch")
	var mu sync.Mutex
	var moved []string
	migrate := func(_ context.Context, id string, to record.Address) error {
		if id == "img-stuck" || (id == "img-b-only" && to == a) {
			return fmt.Errorf("%s to %s: %w", id, to, refused)
		}
		mu.Lock()
		moved = append(moved, id)
		mu.Unlock()
		return nil
	}
	var seen atomic.Int32
	runs := []Run{{ID: "img-1"}, {ID: "tr-1", Transcript: true}, {ID: "img-b-only"}, {ID: "tr-2", Transcript: true}, {ID: "img-stuck"}}
	out := Drain(t.Context(), runs, []record.Address{a, b}, 1, migrate, func(o Outcome, done, total int) {
		if total != len(runs) || int(seen.Add(1)) != done {
			t.Errorf("progress %d/%d after %d outcomes", done, total, seen.Load())
		}
	})
	if got := fmt.Sprint(moved[:2]); got != "[tr-1 tr-2]" {
		t.Fatalf("moved first %s, want the transcript runs", got)
	}
	byRun := map[string]Outcome{}
	for _, o := range out {
		byRun[o.Run] = o
	}
	if byRun["tr-1"].To != a || byRun["tr-2"].To != b {
		t.Fatalf("not spread: %+v", out)
	}
	if o := byRun["img-b-only"]; o.To != b || o.Err != nil {
		t.Fatalf("a run one host refuses: %+v", o)
	}
	if o := byRun["img-stuck"]; !o.To.IsZero() || !errors.Is(o.Err, refused) {
		t.Fatalf("a run every host refuses: %+v", o)
	}
	if seen.Load() != int32(len(runs)) {
		t.Fatalf("%d outcomes told, want %d", seen.Load(), len(runs))
	}
}

// At most parallel runs move at once.
func TestDrainParallel(t *testing.T) {
	var now, most atomic.Int32
	release := make(chan struct{})
	migrate := func(context.Context, string, record.Address) error {
		n := now.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		now.Add(-1)
		return nil
	}
	runs := make([]Run, 6)
	for i := range runs {
		runs[i] = Run{ID: fmt.Sprint(i)}
	}
	done := make(chan []Outcome)
	go func() { done <- Drain(t.Context(), runs, []record.Address{host("a")}, 2, migrate, nil) }()
	for range runs {
		release <- struct{}{}
	}
	out := <-done
	if most.Load() > 2 || len(out) != len(runs) {
		t.Fatalf("%d at once, %d outcomes", most.Load(), len(out))
	}
}

// With no host to offer it to, a run stays, saying so.
func TestDrainNoHost(t *testing.T) {
	out := Drain(t.Context(), []Run{{ID: "r"}}, nil, 2, func(context.Context, string, record.Address) error {
		t.Fatal("migrated with no host")
		return nil
	}, nil)
	if len(out) != 1 || out[0].Err == nil {
		t.Fatalf("%+v", out)
	}
}
