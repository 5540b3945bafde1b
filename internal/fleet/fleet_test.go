package fleet

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// TestFleet runs every directory test against one real 3-member etcd
// cluster; each subtest has its own prefix. The last ones stop members.
func TestFleet(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name string
		f    func(*testing.T, *etcdtest.Cluster, *Dir)
	}{
		{"AdmitAndJoin", testAdmitAndJoin},
		{"ConcurrentClaim", testConcurrentClaim},
		{"StaleHead", testStaleHead},
		{"Transfer", testTransfer},
		{"ClaimSeen", testClaimSeen},
		{"RevertAndReclaim", testRevertAndReclaim},
		{"MalformedEntry", testMalformedEntry},
		{"Fence", testFence},
		{"Peer", testPeer},
		{"ClosedPort", testClosedPort},
		{"LeaseExpiry", testLeaseExpiry},
		{"MemberStopped", testMemberStopped},
		{"NoQuorum", testNoQuorum},
		{"DrainMark", testDrainMark},
		{"Revoke", testRevoke},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(c.Client(t), "/t/"+tc.name+"/", 3*time.Second)
			tc.f(t, c, d)
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func key(name string) record.Address { return record.Sum([]byte("key " + name)) }

// mustJoin admits name as a host and joins it with ttl.
func mustJoin(t *testing.T, d *Dir, name string, ttl time.Duration) *Session {
	t.Helper()
	ctx := ctxFor(t)
	if err := d.Admit(ctx, key(name), name, RoleHost); err != nil {
		t.Fatalf("admit %s: %v", name, err)
	}
	h, err := d.Join(ctx, key(name), ttl)
	if err != nil {
		t.Fatalf("join %s: %v", name, err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

func mustEntry(t *testing.T, d *Dir, g record.Address) Entry {
	t.Helper()
	e, err := d.Run(ctxFor(t), g)
	if err != nil {
		t.Fatalf("run %s: %v", g, err)
	}
	return e
}

func testAdmitAndJoin(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	ctx := ctxFor(t)
	if err := d.Admit(ctx, key("p"), "platform", RolePlatform); err != nil {
		t.Fatal(err)
	}
	if err := d.Admit(ctx, key("p"), "platform", RoleHost); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("role change: %v, want ErrNotAdmitted", err)
	}
	if _, err := d.Join(ctx, key("p"), 0); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("platform joins as a host: %v, want ErrNotAdmitted", err)
	}
	if _, err := d.Join(ctx, key("stranger"), 0); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("unadmitted key joins: %v, want ErrNotAdmitted", err)
	}
	if err := d.Admit(ctx, key("x"), "bad\nname", RoleHost); err == nil {
		t.Fatal("a name with a newline admitted")
	}
	a := mustJoin(t, d, "a", 0)
	if _, err := d.Join(ctx, key("a"), 0); !errors.Is(err, ErrHostActive) {
		t.Fatalf("second session of one key: %v, want ErrHostActive", err)
	}
	if err := d.Admit(ctx, key("a"), "a-renamed", RoleHost); err != nil {
		t.Fatalf("rename: %v", err)
	}
	hosts, err := d.Hosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[record.Address]Member{}
	for _, m := range hosts {
		got[m.Key] = m
	}
	if len(got) != 2 || got[key("a")].Lease != a.Lease() || got[key("a")].Name != "a-renamed" ||
		got[key("p")].Role != RolePlatform || got[key("p")].Lease != 0 {
		t.Fatalf("hosts = %+v", hosts)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	<-a.Done()
	if _, err := a.Claim(ctx, key("g"), "r", key("g"), record.PhaseExecuting); !errors.Is(err, ErrLeaseLost) || !errors.Is(err, ErrNotOwner) {
		t.Fatalf("claim after close: %v, want ErrLeaseLost and ErrNotOwner", err)
	}
	if m, err := d.Member(ctx, key("a")); err != nil || m.Lease != 0 {
		t.Fatalf("after close: %+v, %v; want no lease", m, err)
	}
	// The key joins again once its session is gone.
	b, err := d.Join(ctx, key("a"), 0)
	if err != nil {
		t.Fatalf("join after close: %v", err)
	}
	_ = b.Close(ctx)
}

// testConcurrentClaim: two hosts claim the same runs at the same moment;
// each run gets exactly one owner, and the other host ErrNotOwner.
func testConcurrentClaim(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	hosts := []*Session{mustJoin(t, d, "a", 0), mustJoin(t, d, "b", 0)}
	ctx := ctxFor(t)
	for i := range 8 {
		g := record.Sum([]byte{byte(i)})
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, 2)
		for j, h := range hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[j] = h.Claim(ctx, g, "r", g, record.PhaseExecuting)
			}()
		}
		close(start)
		wg.Wait()
		won := -1
		for j, err := range errs {
			switch {
			case err == nil:
				if won >= 0 {
					t.Fatalf("run %d: both hosts claimed it", i)
				}
				won = j
			case !errors.Is(err, ErrNotOwner):
				t.Fatalf("run %d: host %d: %v, want ErrNotOwner", i, j, err)
			}
		}
		if won < 0 {
			t.Fatalf("run %d: no host claimed it: %v", i, errs)
		}
		if e := mustEntry(t, d, g); e.Owner != hosts[won].Key() || e.Lease != hosts[won].Lease() || e.Head != g {
			t.Fatalf("run %d: entry %+v, want owner %s", i, e, hosts[won].Key())
		}
		// Claiming again is idempotent for the winner, refused for the loser.
		if _, err := hosts[won].Claim(ctx, g, "r", g, record.PhaseExecuting); err != nil {
			t.Fatalf("run %d: claim again: %v", i, err)
		}
		if _, err := hosts[1-won].Claim(ctx, g, "r", g, record.PhaseExecuting); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("run %d: loser claims again: %v", i, err)
		}
	}
}

// testStaleHead: an advance from a head the directory has moved past, or
// by a host that does not own the run, changes nothing.
func testStaleHead(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	a, b := mustJoin(t, d, "a", 0), mustJoin(t, d, "b", 0)
	ctx := ctxFor(t)
	g, h1, h2, h3 := key("g"), key("h1"), key("h2"), key("h3")
	if _, err := a.Claim(ctx, g, "r", g, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Advance(ctx, g, g, h1, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	before := mustEntry(t, d, g)
	if _, err := a.Advance(ctx, g, g, h2, record.PhaseParked); !errors.Is(err, ErrHeadMoved) {
		t.Fatalf("stale advance: %v, want ErrHeadMoved", err)
	}
	if _, err := b.Advance(ctx, g, h1, h3, record.PhaseExecuting); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("advance by another host: %v, want ErrNotOwner", err)
	}
	if _, err := b.Claim(ctx, g, "r", h1, record.PhaseParked); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("claim of a live host's run: %v, want ErrNotOwner", err)
	}
	if _, err := a.Advance(ctx, key("none"), g, h1, record.PhaseParked); !errors.Is(err, ErrNoRun) {
		t.Fatalf("advance of no run: %v, want ErrNoRun", err)
	}
	if after := mustEntry(t, d, g); after != before {
		t.Fatalf("refused advances changed the entry: %+v → %+v", before, after)
	}
	if before.Head != h1 || before.Prev != g || before.Phase != record.PhaseParked || before.PrevPhase != record.PhaseExecuting {
		t.Fatalf("entry after advance: %+v", before)
	}
}

// testClaimSeen: a claim judged on what Transferred read takes the run
// when nothing changed since; when the entry changed (the transfer taken
// back, then made again), it reads afresh and judges what it finds; and a
// transfer taken back is refused, nothing written.
func testClaimSeen(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	a, b := mustJoin(t, d, "a", 0), mustJoin(t, d, "b", 0)
	ctx := ctxFor(t)
	transferred := func(g record.Address) Seen {
		t.Helper()
		if _, err := a.Claim(ctx, g, "r", g, record.PhaseParked); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Transfer(ctx, g, b.Key()); err != nil {
			t.Fatal(err)
		}
		seen, err := b.Transferred(ctx, g, a.Key())
		if err != nil || seen.Entry().To != b.Key() || seen.OwnerLease() != a.Lease() {
			t.Fatalf("transferred: %+v, %v", seen, err)
		}
		return seen
	}

	g1 := key("seen 1")
	if e, err := b.ClaimSeen(ctx, transferred(g1), "r1", g1, record.PhaseParked); err != nil || e.Owner != b.Key() || e.Run != "r1" || !e.To.IsZero() {
		t.Fatalf("claim as seen: %+v, %v", e, err)
	}
	if e := mustEntry(t, d, g1); e.Owner != b.Key() || e.Lease != b.Lease() {
		t.Fatalf("the entry after the claim: %+v", e)
	}

	// Taken back and transferred again after the read: the entry's
	// revision moved, so the claim reads it again and takes it.
	g2 := key("seen 2")
	seen := transferred(g2)
	for _, to := range []*Session{a, b} {
		if _, err := a.Transfer(ctx, g2, to.Key()); err != nil {
			t.Fatal(err)
		}
	}
	if e, err := b.ClaimSeen(ctx, seen, "r2", g2, record.PhaseParked); err != nil || e.Owner != b.Key() {
		t.Fatalf("claim after the entry moved: %+v, %v", e, err)
	}

	// Taken back for good: refused, the entry as the owner left it.
	g3 := key("seen 3")
	seen = transferred(g3)
	if _, err := a.Transfer(ctx, g3, a.Key()); err != nil {
		t.Fatal(err)
	}
	before := mustEntry(t, d, g3)
	if _, err := b.ClaimSeen(ctx, seen, "r3", g3, record.PhaseParked); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("claim of a transfer taken back: %v, want ErrNotOwner", err)
	}
	if after := mustEntry(t, d, g3); after.Owner != a.Key() || after.Rev != before.Rev {
		t.Fatalf("the entry after a refused claim: %+v, was %+v", after, before)
	}
}

// testTransfer: a transferred run is the target's to claim, and no longer
// its owner's to advance; nobody else may take it.
func testTransfer(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	a, b, c := mustJoin(t, d, "a", 0), mustJoin(t, d, "b", 0), mustJoin(t, d, "c", 0)
	ctx := ctxFor(t)
	if err := d.Admit(ctx, key("p"), "p", RolePlatform); err != nil {
		t.Fatal(err)
	}
	g, h1, h2 := key("g"), key("h1"), key("h2")
	if _, err := a.Claim(ctx, g, "r", g, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Transfer(ctx, g, b.Key()); !errors.Is(err, ErrNotParked) {
		t.Fatalf("transfer of an executing run: %v, want ErrNotParked", err)
	}
	if _, err := a.Advance(ctx, g, g, h1, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Transfer(ctx, g, key("p")); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("transfer to a platform key: %v, want ErrNotAdmitted", err)
	}
	if _, err := b.Transfer(ctx, g, c.Key()); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("transfer by a host that does not own it: %v, want ErrNotOwner", err)
	}
	// Transfer, take it back, transfer again.
	for _, to := range []*Session{b, a, b} {
		if _, err := a.Transfer(ctx, g, to.Key()); err != nil {
			t.Fatalf("transfer to %s: %v", to.Key(), err)
		}
	}
	if _, err := a.Advance(ctx, g, h1, h2, record.PhaseExecuting); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("advance after transfer: %v, want ErrNotOwner", err)
	}
	if _, err := c.Claim(ctx, g, "r", h1, record.PhaseParked); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("claim by a third host: %v, want ErrNotOwner", err)
	}
	if _, err := b.Claim(ctx, g, "r2", g, record.PhaseExecuting); !errors.Is(err, ErrHeadMoved) {
		t.Fatalf("claim at an old head: %v, want ErrHeadMoved", err)
	}
	e, err := b.Claim(ctx, g, "r2", h1, record.PhaseParked)
	if err != nil {
		t.Fatalf("target claims: %v", err)
	}
	if e.Owner != b.Key() || !e.To.IsZero() || e.Run != "r2" || e.Head != h1 {
		t.Fatalf("after the target's claim: %+v", e)
	}
	if _, err := a.Transfer(ctx, g, a.Key()); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("taking back a claimed transfer: %v, want ErrNotOwner", err)
	}
	if _, err := b.Advance(ctx, g, h1, h2, record.PhaseExecuting); err != nil {
		t.Fatalf("new owner advances: %v", err)
	}
}

// testRevertAndReclaim: an advance taken back, live and after a restart.
func testRevertAndReclaim(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	a, b := mustJoin(t, d, "a", 0), mustJoin(t, d, "b", 0)
	ctx := ctxFor(t)
	g, h1, h2 := key("g"), key("h1"), key("h2")
	if _, err := a.Claim(ctx, g, "r", g, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Advance(ctx, g, g, h1, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Revert(ctx, g, h1); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("revert by another host: %v, want ErrNotOwner", err)
	}
	e, err := a.Revert(ctx, g, h1)
	if err != nil || e.Head != g || e.Phase != record.PhaseExecuting || !e.Prev.IsZero() {
		t.Fatalf("revert: %+v, %v", e, err)
	}
	if _, err := a.Revert(ctx, g, g); !errors.Is(err, ErrHeadMoved) {
		t.Fatalf("second revert: %v, want ErrHeadMoved", err)
	}

	// A reservation, then the host's session ends (a crash, then a start).
	if _, err := a.Advance(ctx, g, g, h2, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Another host holding the run at the reserved head's predecessor may
	// not take it back: only the owner knows the advance was not appended.
	if _, err := b.Claim(ctx, g, "r", g, record.PhaseExecuting); !errors.Is(err, ErrHeadMoved) {
		t.Fatalf("another host claims at the previous head: %v, want ErrHeadMoved", err)
	}
	a2, err := d.Join(ctx, key("a"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a2.Close(context.Background()) })
	owned, err := d.Owned(ctx, key("a"))
	if err != nil || len(owned) != 1 || owned[0].Genesis != g || owned[0].Head != h2 {
		t.Fatalf("owned by a after its restart: %+v, %v", owned, err)
	}
	e, err = a2.Claim(ctx, g, "r", g, record.PhaseExecuting)
	if err != nil || e.Head != g || e.Phase != record.PhaseExecuting || e.Lease != a2.Lease() || !e.Prev.IsZero() {
		t.Fatalf("reclaim at the previous head: %+v, %v", e, err)
	}

	// Remove: only the owner, only an entry still at its genesis.
	if err := b.Remove(ctx, g); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("remove by another host: %v, want ErrNotOwner", err)
	}
	if _, err := a2.Advance(ctx, g, g, h1, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	if err := a2.Remove(ctx, g); !errors.Is(err, ErrHeadMoved) {
		t.Fatalf("remove of an advanced run: %v, want ErrHeadMoved", err)
	}
	left := key("left")
	if _, err := a2.Claim(ctx, left, "new", left, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if err := a2.Remove(ctx, left); err != nil {
		t.Fatalf("remove a leftover claim: %v", err)
	}
	if _, err := d.Run(ctx, left); !errors.Is(err, ErrNoRun) {
		t.Fatalf("after remove: %v, want ErrNoRun", err)
	}
}

// testMalformedEntry: a value that is not the documented layout is
// ErrEntry, never an entry.
func testMalformedEntry(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	ctx := ctxFor(t)
	a := mustJoin(t, d, "a", 0)
	good := Entry{Run: "r", Owner: key("a"), Lease: 7, Head: key("h"), Phase: record.PhaseParked}.encode()
	for name, v := range map[string]string{
		"garbage":  "not json",
		"unknown":  `{"v":1,"run":"r","owner":"` + key("a").String() + `","lease":7,"head":"` + key("h").String() + `","phase":"parked","extra":1}`,
		"phase":    `{"v":1,"run":"r","owner":"` + key("a").String() + `","lease":7,"head":"` + key("h").String() + `","phase":"sleeping"}`,
		"format":   `{"v":2,"run":"r","owner":"` + key("a").String() + `","lease":7,"head":"` + key("h").String() + `","phase":"parked"}`,
		"address":  `{"v":1,"run":"r","owner":"b3:x","lease":7,"head":"` + key("h").String() + `","phase":"parked"}`,
		"trailing": string(good) + "{}",
	} {
		g := key(name)
		if _, err := d.cli.Put(ctx, d.runKey(g), v); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Run(ctx, g); !errors.Is(err, ErrEntry) {
			t.Errorf("%s: %v, want ErrEntry", name, err)
		}
		if _, err := a.Claim(ctx, g, "r", g, record.PhaseExecuting); !errors.Is(err, ErrEntry) {
			t.Errorf("%s: claim: %v, want ErrEntry", name, err)
		}
	}
	g := key("good")
	if _, err := d.cli.Put(ctx, d.runKey(g), string(good)); err != nil {
		t.Fatal(err)
	}
	if e, err := d.Run(ctx, g); err != nil || e.encode() == nil || string(e.encode()) != string(good) {
		t.Fatalf("good entry: %+v, %v", e, err)
	}
}

// testClosedPort: a directory whose etcd is not there says so, and claims
// nothing.
func testClosedPort(t *testing.T, c *etcdtest.Cluster, _ *Dir) {
	cli := etcdtest.NewClient(t, "http://127.0.0.1:1")
	d := New(cli, "/t/ClosedPort/", 500*time.Millisecond)
	ctx := ctxFor(t)
	if err := d.Admit(ctx, key("a"), "a", RoleHost); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("admit: %v, want ErrUnavailable", err)
	}
	if _, err := d.Join(ctx, key("a"), 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("join: %v, want ErrUnavailable", err)
	}
	if _, err := d.Orphans(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("orphans: %v, want ErrUnavailable", err)
	}
	real := New(c.Client(t), "/t/ClosedPort/", 0)
	if hosts, err := real.Hosts(ctx); err != nil || len(hosts) != 0 {
		t.Fatalf("the cluster holds %v, %v; want nothing", hosts, err)
	}
}

// testLeaseExpiry: a host cut off from etcd loses its lease; its run is
// an orphan, another host claims it, and the first may not advance it.
func testLeaseExpiry(t *testing.T, c *etcdtest.Cluster, d *Dir) {
	ctx := ctxFor(t)
	b := mustJoin(t, d, "b", 0)
	if err := d.Admit(ctx, key("a"), "a", RoleHost); err != nil {
		t.Fatal(err)
	}
	// a reaches etcd only through member 2.
	ad := New(etcdtest.NewClient(t, c.Endpoint(2)), "/t/LeaseExpiry/", time.Second)
	a, err := ad.Join(ctx, key("a"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	g, h1 := key("g"), key("h1")
	if _, err := a.Claim(ctx, g, "r", g, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Advance(ctx, g, g, h1, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	// A closed run needs no owner: never an orphan.
	if _, err := a.Claim(ctx, key("g2"), "r2", key("g2"), record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Advance(ctx, key("g2"), key("g2"), key("c2"), record.PhaseClosed); err != nil {
		t.Fatal(err)
	}
	// Renewals keep the session past the life of its first grant: the
	// property is about time passing, so the test waits for that time.
	first := a.ValidUntil()
	time.Sleep(time.Until(first) + 100*time.Millisecond)
	if a.Err() != nil {
		t.Fatalf("a's session ended while etcd was reachable: %v", a.Err())
	}
	if !a.ValidUntil().After(first) {
		t.Fatalf("a's lease not renewed: valid until %s, as first granted", a.ValidUntil())
	}
	if m, err := d.Member(ctx, key("a")); err != nil || m.Lease != a.Lease() {
		t.Fatalf("a after its first TTL: %+v, %v; want lease %x", m, err, a.Lease())
	}
	if o, err := d.Orphans(ctx); err != nil || len(o) != 0 {
		t.Fatalf("orphans while a lives: %+v, %v", o, err)
	}
	gone := d.cli.Watch(ctx, d.aliveKey(key("a")), clientv3.WithFilterPut())

	c.Stop(2)
	defer func() {
		c.Restart(t, 2)
		c.WaitHealthy(ctx, t)
	}()
	select {
	case <-a.Done():
	case <-ctx.Done():
		t.Fatal("a's session did not end")
	}
	if !errors.Is(a.Err(), ErrLeaseLost) {
		t.Fatalf("a's session ended with %v", a.Err())
	}
	if _, err := a.Advance(ctx, g, h1, key("h2"), record.PhaseExecuting); !errors.Is(err, ErrNotOwner) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("advance after the lease is lost: %v, want ErrNotOwner and ErrLeaseLost", err)
	}
	// etcd expires the lease no sooner than a stopped trusting it.
	if w := <-gone; w.Err() != nil || len(w.Events) == 0 {
		t.Fatalf("watch of a's session: %v", w.Err())
	}
	o, err := d.Orphans(ctx)
	if err != nil || len(o) != 1 || o[0].Genesis != g || o[0].Owner != key("a") || o[0].Head != h1 {
		t.Fatalf("orphans = %+v, %v; want a's run", o, err)
	}
	e, err := b.Claim(ctx, g, "r", h1, record.PhaseParked)
	if err != nil || e.Owner != b.Key() {
		t.Fatalf("b adopts the orphan: %+v, %v", e, err)
	}
	if o, err := d.Orphans(ctx); err != nil || len(o) != 0 {
		t.Fatalf("orphans after adoption: %+v, %v", o, err)
	}
}

// testMemberStopped: with one of three members stopped, every operation
// goes through.
func testMemberStopped(t *testing.T, c *etcdtest.Cluster, d *Dir) {
	c.Stop(0)
	defer func() {
		ctx := ctxFor(t)
		c.Restart(t, 0)
		c.WaitHealthy(ctx, t)
	}()
	a, b := mustJoin(t, d, "a", 0), mustJoin(t, d, "b", 0)
	ctx := ctxFor(t)
	g, h1, h2 := key("g"), key("h1"), key("h2")
	if _, err := a.Claim(ctx, g, "r", g, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Advance(ctx, g, g, h1, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Transfer(ctx, g, b.Key()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(ctx, g, "r", h1, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Advance(ctx, g, h1, h2, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Orphans(ctx); err != nil {
		t.Fatal(err)
	}
	if e := mustEntry(t, d, g); e.Owner != b.Key() || e.Head != h2 {
		t.Fatalf("entry %+v", e)
	}
}

// testNoQuorum: with two of three members stopped etcd cannot confirm
// anything: a claim is ErrUnavailable, and once quorum is back nothing
// was claimed.
func testNoQuorum(t *testing.T, c *etcdtest.Cluster, d *Dir) {
	a := mustJoin(t, d, "a", 0)
	ctx := ctxFor(t)
	g := key("g")
	c.Stop(1)
	c.Stop(2)
	d1 := New(d.cli, "/t/NoQuorum/", time.Second)
	a.Dir = d1
	if _, err := a.Claim(ctx, g, "r", g, record.PhaseExecuting); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("claim without quorum: %v, want ErrUnavailable", err)
	}
	if _, err := d1.Run(ctx, g); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("read without quorum: %v, want ErrUnavailable", err)
	}
	c.Restart(t, 1)
	c.WaitHealthy(ctx, t)
	if _, err := d.Run(ctx, g); !errors.Is(err, ErrNoRun) {
		t.Fatalf("after quorum came back: %v, want ErrNoRun (nothing claimed)", err)
	}
}

// TestValueBytes pins the JSON an entry and an admission are written as
// (docs/fleet.md, "Key layout").
func TestValueBytes(t *testing.T) {
	g, h, p, to := record.Sum([]byte("g")), record.Sum([]byte("h")), record.Sum([]byte("p")), record.Sum([]byte("to"))
	e := Entry{Run: "r1", Owner: key("a"), Lease: 7587882736402911234, Head: h, Phase: record.PhaseParked,
		Prev: p, PrevPhase: record.PhaseExecuting, To: to}
	want := `{"v":1,"run":"r1","owner":"` + key("a").String() + `","lease":7587882736402911234,"head":"` + h.String() +
		`","phase":"parked","prev":"` + p.String() + `","prev_phase":"executing","to":"` + to.String() + `"}`
	if got := string(e.encode()); got != want {
		t.Fatalf("entry:\n got %s\nwant %s", got, want)
	}
	back, err := decodeEntry(g, []byte(want), 9)
	e.Genesis, e.Rev = g, 9
	if err != nil || back != e {
		t.Fatalf("decode: %+v, %v; want %+v", back, err, e)
	}
	bare := Entry{Run: "r1", Owner: key("a"), Lease: 1, Head: g, Phase: record.PhaseExecuting}
	if got, want := string(bare.encode()), `{"v":1,"run":"r1","owner":"`+key("a").String()+`","lease":1,"head":"`+g.String()+`","phase":"executing"}`; got != want {
		t.Fatalf("bare entry:\n got %s\nwant %s", got, want)
	}
	m := Member{Name: "host one", Role: RoleHost, Admitted: time.Date(2026, 12, 3, 13, 0, 0, 0, time.UTC)}
	if got, want := string(m.encode()), `{"v":1,"name":"host one","role":"host","admitted":"2026-12-03T13:00:00Z"}`; got != want {
		t.Fatalf("member:\n got %s\nwant %s", got, want)
	}
}
