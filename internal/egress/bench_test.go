package egress

import (
	"slices"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// BenchmarkLink is a run's link on a host of its own (private network
// namespaces), each step timed alone: Allow and Attach (a start), Detach
// (a park), Attach again (a resume), Close. As root: go test -run XXX
// -bench Link -benchtime 21x ./internal/egress/ (docs/benchmarks.md,
// "Egress").
func BenchmarkLink(b *testing.B) {
	w := newWorld(b, Config{})
	steps := map[string][]time.Duration{}
	lap := func(name string, t0 time.Time) time.Time {
		now := time.Now()
		steps[name] = append(steps[name], now.Sub(t0))
		return now
	}
	d, err := unit.ParseDest(worldIP + "/32:80")
	if err != nil {
		b.Fatal(err)
	}
	ds := []unit.Dest{d}
	for b.Loop() {
		sb, path := newNetns(b)
		t0 := time.Now()
		r, err := w.host.Allow(1, ds)
		if err != nil {
			b.Fatal(err)
		}
		t0 = lap("allow", t0)
		if err := r.Attach(path); err != nil {
			b.Fatal(err)
		}
		t0 = lap("attach", t0)
		if err := r.Detach(); err != nil {
			b.Fatal(err)
		}
		t0 = lap("detach", t0)
		if err := r.Attach(path); err != nil {
			b.Fatal(err)
		}
		t0 = lap("reattach", t0)
		if err := r.Close(); err != nil {
			b.Fatal(err)
		}
		lap("close", t0)
		sb.Close()
	}
	for _, s := range []string{"allow", "attach", "detach", "reattach", "close"} {
		v := slices.Clone(steps[s])
		slices.Sort(v)
		b.ReportMetric(float64(v[len(v)/2])/1e6, s+"-ms")
	}
}
