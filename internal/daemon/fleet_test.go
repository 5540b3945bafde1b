package daemon

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// inFleet puts d in a fleet under session h, rejoining with rejoin after
// a lost lease (never, when nil).
func inFleet(d *Daemon, h *fleet.Session, rejoin func(context.Context) (*fleet.Session, error)) {
	d.cfg.Fleet, d.cfg.Rejoin = h, rejoin
	d.wire()
}

// joinFleet admits name as a host of dir and joins it.
func joinFleet(t *testing.T, dir *fleet.Dir, name string) *fleet.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := record.Sum([]byte("host " + name))
	if err := dir.Admit(ctx, key, name, fleet.RoleHost); err != nil {
		t.Fatal(err)
	}
	h, err := dir.Join(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// In a fleet the daemon claims a run as it starts and reserves every
// advance in etcd before it appends: the directory's head follows the
// record's through park and resume. A run this host no longer may advance
// (here: transferred to another host) is not resumed — no sandbox, the
// record and the directory as they were.
func TestFleetOwnership(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/daemon/", 5*time.Second)
	a, b := joinFleet(t, dir, "a"), joinFleet(t, dir, "b")
	h := newFakeHost(t)
	inFleet(h.d, a, nil)

	sum := h.start(t, "r")
	entry := func() fleet.Entry {
		t.Helper()
		e, err := dir.Run(t.Context(), record.Genesis(sum.Unit, sum.Grants))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	follows := func(step string, phase record.Phase) {
		t.Helper()
		head, _ := h.d.st.Head("r")
		if e := entry(); e.Head != head || e.Phase != phase || e.Owner != a.Key() {
			t.Fatalf("after %s: directory %+v, record at %s", step, e, head)
		}
	}
	follows("start", record.PhaseExecuting)
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	follows("park", record.PhaseParked)
	h.teardown(t, "r")
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	follows("resume", record.PhaseExecuting)
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	follows("the second park", record.PhaseParked)

	if _, err := a.Transfer(t.Context(), entry().Genesis, b.Key()); err != nil {
		t.Fatal(err)
	}
	before := entry()
	if _, err := h.d.Resume(t.Context(), "r", nil); !errors.Is(err, fleet.ErrNotOwner) {
		t.Fatalf("resume of a run transferred away: %v, want ErrNotOwner", err)
	}
	if h.ex.sandbox("r") != nil {
		t.Fatal("a refused resume left a sandbox")
	}
	if e := entry(); e.Head != before.Head || e.Rev != before.Rev {
		t.Fatalf("a refused resume moved the directory: %+v, was %+v", e, before)
	}
	if got := h.kinds(t, "r"); got != "executed suspended resumed executed suspended" {
		t.Fatalf("segments %s", got)
	}
	if _, err := h.d.Close(t.Context(), "r", "done"); !errors.Is(err, fleet.ErrNotOwner) {
		t.Fatalf("close of a run transferred away: %v, want ErrNotOwner", err)
	}
}

// A restarted host reconciles its store with the directory before anything
// else: a reservation a crash left unappended is taken back (the run
// resumes from the record's head), a new run's claim whose run was never
// created is removed, a migration out whose target has not claimed the run
// is taken back (the run resumes here), and a run another host claimed
// meanwhile is held handed off.
func TestFleetReconcileAtStart(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/restart/", 5*time.Second)
	a, b := joinFleet(t, dir, "a"), joinFleet(t, dir, "b")
	h := newFakeHost(t)
	inFleet(h.d, a, nil)
	ctx := t.Context()

	genesisOf := func(id string) record.Address {
		st, err := h.d.st.Run(id)
		if err != nil {
			t.Fatal(err)
		}
		return record.Genesis(st.Unit, st.Grants)
	}
	for _, id := range []string{"reserved", "moved", "inflight"} {
		h.start(t, id)
		if _, err := h.d.Park(ctx, id); err != nil {
			t.Fatal(err)
		}
		h.teardown(t, id)
	}
	head, _ := h.d.st.Head("reserved")
	// The crash: etcd advanced, bbolt never appended.
	fence := &fleet.Fence{Store: h.d.st, Session: a}
	if _, err := fence.Reserve(ctx, "reserved", head, record.Closure("never appended")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"moved", "inflight"} {
		if _, err := a.Transfer(ctx, genesisOf(id), b.Key()); err != nil {
			t.Fatal(err)
		}
	}
	movedHead, _ := h.d.st.Head("moved")
	if _, err := b.Claim(ctx, genesisOf("moved"), "moved", movedHead, record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	leftover := record.Sum([]byte("a run never created"))
	if _, err := a.Claim(ctx, leftover, "ghost", leftover, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}

	// The restart: a new session of the same key.
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	a2, err := dir.Join(ctx, a.Key(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a2.Close(context.Background()) })
	inFleet(h.d, a2, nil)
	if _, err := h.d.fleet.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := dir.Run(ctx, genesisOf("reserved")); err != nil || e.Head != head || e.Lease != a2.Lease() {
		t.Fatalf("the unappended reservation: %+v, %v; want at %s under the new session", e, err, head)
	}
	if _, err := h.d.Resume(ctx, "reserved", nil); err != nil {
		t.Fatalf("resume after the reconcile: %v", err)
	}
	if _, err := dir.Run(ctx, leftover); !errors.Is(err, fleet.ErrNoRun) {
		t.Fatalf("the leftover claim: %v, want removed", err)
	}
	if _, off, _ := h.d.st.HandedOff("moved"); !off {
		t.Fatal("a run transferred away is not held handed off")
	}
	if _, err := h.d.Resume(ctx, "moved", nil); !errors.Is(err, store.ErrHandedOff) {
		t.Fatalf("resume of a run transferred away: %v", err)
	}
	if e, err := dir.Run(ctx, genesisOf("inflight")); err != nil || e.Owner != a2.Key() || !e.To.IsZero() {
		t.Fatalf("a migration in flight: %+v, %v; want taken back", e, err)
	}
	if _, err := h.d.Resume(ctx, "inflight", nil); err != nil {
		t.Fatalf("resume of a migration taken back: %v", err)
	}
}

// A session whose lease is lost (here: revoked behind its back) is
// replaced: until then the host appends nothing; once rejoined it claims
// back its runs, and a park goes through again.
func TestFleetRejoin(t *testing.T) {
	c := etcdtest.Shared(t)
	cli := c.Client(t)
	dir := fleet.New(cli, "/rejoin/", 5*time.Second)
	a := joinFleet(t, dir, "a")
	h := newFakeHost(t)
	rejoins := make(chan *fleet.Session, 4)
	inFleet(h.d, a, func(ctx context.Context) (*fleet.Session, error) {
		nh, err := dir.Join(ctx, a.Key(), 10*time.Second)
		if err == nil {
			t.Cleanup(func() { _ = nh.Close(context.Background()) })
			rejoins <- nh
		}
		return nh, err
	})
	h.d.fleet.WatchLease(h.d.bgCtx, &h.d.bg)
	ctx := t.Context()
	h.start(t, "r")

	if _, err := cli.Revoke(ctx, clientv3.LeaseID(a.Lease())); err != nil {
		t.Fatal(err)
	}
	var nh *fleet.Session
	select {
	case nh = <-rejoins:
	case <-time.After(30 * time.Second):
		t.Fatal("the lost session was not replaced")
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.d.fleet.Session() != nh {
		if time.Now().After(deadline) {
			t.Fatal("the daemon does not use the new session")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var err error
	for time.Now().Before(deadline) {
		if _, err = h.d.Park(ctx, "r"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // the reconcile's claim may not be in yet
	}
	if err != nil {
		t.Fatalf("park after the rejoin: %v", err)
	}
	st, _ := h.d.st.Run("r")
	if e, err := dir.Run(ctx, record.Genesis(st.Unit, st.Grants)); err != nil || e.Lease != nh.Lease() || e.Head != st.Head {
		t.Fatalf("directory %+v, %v; want owned under the new session at %s", e, err, st.Head)
	}
	h.teardown(t, "r")
}

// A lease that lapses unconfirmed (etcd lost its quorum) freezes the
// host's units before etcd could expire it; once confirmed again — renewed
// or by a new session — they are thawed, the run still this host's.
func TestFleetLeaseGuard(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/guard/", 2*time.Second)
	ctx := t.Context()
	key := record.Sum([]byte("host guarded"))
	if err := dir.Admit(ctx, key, "guarded", fleet.RoleHost); err != nil {
		t.Fatal(err)
	}
	a, err := dir.Join(ctx, key, 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	h := newFakeHost(t)
	inFleet(h.d, a, func(ctx context.Context) (*fleet.Session, error) {
		nh, err := dir.Join(ctx, key, 6*time.Second)
		if err == nil {
			t.Cleanup(func() { _ = nh.Close(context.Background()) })
		}
		return nh, err
	})
	h.start(t, "r")
	h.d.fleet.Watch(h.d.bgCtx, &h.d.bg)
	sb := h.ex.sandbox("r")
	status := func() string {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		return sb.status
	}
	wait := func(want string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for status() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the unit is %s, want %s", status(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	c.Stop(1)
	c.Stop(2)
	wait("paused", 10*time.Second)
	if v := time.Until(h.d.fleet.Session().ValidUntil()); v <= 0 {
		t.Fatalf("frozen only %v after the lease could lapse", -v)
	}
	c.Restart(t, 1)
	c.Restart(t, 2)
	wait("running", 30*time.Second)
	if _, err := h.d.Park(ctx, "r"); err != nil {
		t.Fatalf("park once the lease is confirmed again: %v", err)
	}
	h.teardown(t, "r")
}
