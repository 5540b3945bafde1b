package fleet

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// fenced is a host of the fleet with its own store, appending through a
// Fence.
type fenced struct {
	host  *Session
	st    *store.Store
	fence *Fence
}

func newFenced(t *testing.T, d *Dir, name string) fenced {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := mustJoin(t, d, name, 10*time.Second)
	return fenced{host: h, st: st, fence: &Fence{Store: st, Session: h}}
}

// create stores run id (the same genesis on every host for one id) and,
// with claim, claims it for f's host.
func (f fenced) create(t *testing.T, id string, claim bool) (genesis record.Address) {
	t.Helper()
	u, err := f.st.PutBytes([]byte("unit of " + id))
	if err != nil {
		t.Fatal(err)
	}
	g, err := f.st.PutBytes([]byte("grants of " + id))
	if err != nil {
		t.Fatal(err)
	}
	head, err := f.st.Create(id, u, g)
	if err != nil {
		t.Fatal(err)
	}
	if claim {
		if _, err := f.host.Claim(ctxFor(t), head, id, head, record.PhaseExecuting); err != nil {
			t.Fatal(err)
		}
	}
	return head
}

func (f fenced) head(t *testing.T, id string) record.Address {
	t.Helper()
	h, err := f.st.Head(id)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// An append through the fence moves etcd and bbolt together; refused by
// either, neither moves (etcd's reservation is taken back).
func testFence(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	ctx := ctxFor(t)
	a, b := newFenced(t, d, "a"), newFenced(t, d, "b")

	g := a.create(t, "done", true)
	head, err := a.fence.AppendAll("done", g, record.Closure("finished"))
	if err != nil {
		t.Fatal(err)
	}
	if e := mustEntry(t, d, g); e.Head != head || e.Phase != record.PhaseClosed || head != a.head(t, "done") {
		t.Fatalf("entry %+v, store at %s, append made %s", e, a.head(t, "done"), head)
	}

	// Another host holding the same run appends nothing.
	g = a.create(t, "theirs", true)
	b.create(t, "theirs", false)
	if _, err := b.fence.AppendAll("theirs", g, record.Closure("not mine")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("a host that does not own the run: %v, want ErrNotOwner", err)
	}
	if b.head(t, "theirs") != g || mustEntry(t, d, g).Head != g {
		t.Fatal("a refused advance moved a head")
	}

	// A segment the record refuses reserves nothing.
	g = a.create(t, "refused", true)
	if _, err := a.fence.AppendAll("refused", g, record.Resumption(record.TranscriptSnapshot(g), 1, record.Estimated)); err == nil {
		t.Fatal("a Resumed segment of an executing run was reserved")
	}
	if e := mustEntry(t, d, g); e.Head != g || !e.Prev.IsZero() {
		t.Fatalf("a segment the record refuses advanced the entry: %+v", e)
	}

	// The store refuses the reserved append (another writer moved the
	// record): etcd is taken back to the head the store still has.
	g = a.create(t, "moved", true)
	r, err := a.fence.Reserve(ctx, "moved", g, record.Closure("mine"))
	if err != nil {
		t.Fatal(err)
	}
	if mustEntry(t, d, g).Head != r.Next() {
		t.Fatal("the reservation is not in etcd")
	}
	if _, err := a.st.Append("moved", g, record.Closure("another writer")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Append(ctx); !errors.Is(err, store.ErrHeadMoved) {
		t.Fatalf("append after another writer: %v, want the store's refusal", err)
	}
	if e := mustEntry(t, d, g); e.Head != g {
		t.Fatalf("the refused append's reservation was not taken back: %+v", e)
	}

	// A resume whose restore failed cancels its reservation.
	g = a.create(t, "cancelled", true)
	if r, err = a.fence.Reserve(ctx, "cancelled", g, record.Closure("never")); err != nil {
		t.Fatal(err)
	}
	if err := r.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if e := mustEntry(t, d, g); e.Head != g || a.head(t, "cancelled") != g {
		t.Fatalf("after a cancel: entry %+v, store at %s", e, a.head(t, "cancelled"))
	}
}

// A session says where its host serves the fleet; a session without a
// listener says nothing.
func testPeer(t *testing.T, _ *etcdtest.Cluster, d *Dir) {
	ctx := ctxFor(t)
	if err := d.Admit(ctx, key("p"), "p", RoleHost); err != nil {
		t.Fatal(err)
	}
	h, err := d.JoinAt(ctx, key("p"), 10*time.Second, "127.0.0.1:7443")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(ctx)
	quiet := mustJoin(t, d, "q", 10*time.Second)
	if m, err := d.Member(ctx, key("p")); err != nil || m.Peer != "127.0.0.1:7443" || m.Lease != h.Lease() {
		t.Fatalf("member %+v, %v", m, err)
	}
	hosts, err := d.Hosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range hosts {
		if want := map[record.Address]string{key("p"): "127.0.0.1:7443", quiet.Key(): ""}[m.Key]; m.Peer != want {
			t.Fatalf("hosts: %s at %q, want %q", m.Name, m.Peer, want)
		}
	}
}
