package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Revoke removes a host's membership and its session's lease: a watcher
// hears of it, the host's advance is refused, it cannot join again, its
// run is an orphan that another host adopts; a platform key (no session)
// is removed too; a key not admitted is ErrNotAdmitted. Admitting a key
// again is heard as such.
func testRevoke(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	ctx := ctxFor(t)
	a, b := mustJoin(t, d, "a", 10*time.Second), mustJoin(t, d, "b", 10*time.Second)
	if err := d.Admit(ctx, key("p"), "platform", RolePlatform); err != nil {
		t.Fatal(err)
	}
	g, h1, h2 := record.Sum([]byte("g")), record.Sum([]byte("h1")), record.Sum([]byte("h2"))
	if _, err := a.Claim(ctx, g, "r", g, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Advance(ctx, g, g, h1, record.PhaseParked); err != nil {
		t.Fatal(err)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	heard, readmitted := make(chan record.Address, 4), make(chan record.Address, 4)
	go d.WatchRevoked(wctx, func(k record.Address) { heard <- k }, func(k record.Address) { readmitted <- k }, func() {})
	time.Sleep(200 * time.Millisecond) // the watch opens from the revision it read first

	m, err := d.Revoke(ctx, a.Key())
	if err != nil || m.Lease != a.Lease() || m.Role != RoleHost {
		t.Fatalf("revoke a: %+v, %v", m, err)
	}
	select {
	case k := <-heard:
		if k != a.Key() {
			t.Fatalf("heard %s revoked, want %s", k, a.Key())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not hear the revocation within 5 s")
	}
	if _, err := d.Member(ctx, a.Key()); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a after its revocation: %v", err)
	}
	if _, err := a.Advance(ctx, g, h1, h2, record.PhaseExecuting); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("an advance of the revoked host: %v", err)
	}
	if _, err := d.Join(ctx, a.Key(), time.Second); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("the revoked host joins again: %v", err)
	}
	if e, err := b.Adopt(ctx, g, "r", h1, record.PhaseParked); err != nil || e.Owner != b.Key() {
		t.Fatalf("adopt of the revoked host's run: %+v, %v", e, err)
	}

	if m, err := d.Revoke(ctx, key("p")); err != nil || m.Lease != 0 || m.Role != RolePlatform {
		t.Fatalf("revoke a platform key: %+v, %v", m, err)
	}
	if _, err := d.Revoke(ctx, key("p")); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("revoke a key not admitted: %v", err)
	}
	if err := d.Admit(ctx, key("p"), "platform", RolePlatform); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan record.Address{heard, readmitted} {
		select {
		case k := <-ch:
			if k != key("p") {
				t.Fatalf("heard %s, want the platform key", k)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the watch did not hear the platform key's revocation and admission")
		}
	}
}
