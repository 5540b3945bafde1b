package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
)

// A session's drain mark is seen by Member and Hosts while it lives, and
// ends with it: the host's next session is not draining.
func testDrainMark(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	ctx := ctxFor(t)
	h := mustJoin(t, d, "drained", 10*time.Second)
	mustJoin(t, d, "other", 10*time.Second)
	if err := h.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	draining := func(k string) (bool, bool) {
		t.Helper()
		m, err := d.Member(ctx, key(k))
		if err != nil {
			t.Fatal(err)
		}
		ms, err := d.Hosts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range ms {
			if x.Key == key(k) {
				return m.Draining, x.Draining
			}
		}
		t.Fatalf("%s not listed", k)
		return false, false
	}
	if a, b := draining("drained"); !a || !b {
		t.Fatalf("the drained host: Member %v, Hosts %v", a, b)
	}
	if a, b := draining("other"); a || b {
		t.Fatal("the other host is draining")
	}
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	h2, err := d.Join(ctx, key("drained"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h2.Close(context.Background()) })
	if a, b := draining("drained"); a || b {
		t.Fatal("the mark outlived its session")
	}
	if err := h.Drain(ctx); err == nil {
		t.Fatal("a closed session marked itself draining")
	}
}
