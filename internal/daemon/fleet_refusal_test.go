package daemon

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// warnsTo is a logger that passes every record on and sends the messages
// of warn level and above that contain match on msgs.
type warnsTo struct {
	slog.Handler
	match string
	msgs  chan string
}

func (h warnsTo) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && strings.Contains(r.Message, h.match) {
		select {
		case h.msgs <- r.Message:
		default:
		}
	}
	return h.Handler.Handle(ctx, r)
}

// heldElsewhere checks that run id, executing here and taken by another
// host, lost its sandbox here and nothing was appended: the record at
// head, the directory's entry other's.
func (h *fakeHost) heldElsewhere(t *testing.T, dir *fleet.Dir, id string, head record.Address, other *fleet.Session) {
	t.Helper()
	if h.ex.sandbox(id) != nil {
		t.Fatal("the sandbox of a run another host took is left here")
	}
	st, err := h.d.st.Run(id)
	if err != nil || st.Head != head || st.Phase != record.PhaseExecuting {
		t.Fatalf("the record: %+v %v, want as it was at %s", st, err, head)
	}
	if e, err := dir.Run(t.Context(), record.Genesis(st.Unit, st.Grants)); err != nil || e.Owner != other.Key() || e.Head != head {
		t.Fatalf("the directory: %+v %v, want the other host's at %s", e, err, head)
	}
}

// A restarted host whose executing run another host took meanwhile (its
// lease gone, the run claimed) removes the run's sandbox here and appends
// nothing (reconcile.go's elsewhere branch).
func TestFleetReconcileDropsRunTakenElsewhere(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/taken/", 5*time.Second)
	a, b := joinFleet(t, dir, "a"), joinFleet(t, dir, "b")
	h := newFakeHost(t)
	inFleet(h.d, a, nil)
	ctx := t.Context()
	h.start(t, "r")
	st, _ := h.d.st.Run("r")
	// The crash: a's session gone with its process, b takes the orphan.
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(ctx, record.Genesis(st.Unit, st.Grants), "r", st.Head, record.PhaseExecuting); err != nil {
		t.Fatal(err)
	}
	h.restart()
	a2, err := dir.Join(ctx, a.Key(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a2.Close(context.Background()) })
	inFleet(h.d, a2, nil)
	if err := h.d.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	h.heldElsewhere(t, dir, "r", st.Head, b)
	if got := h.kinds(t, "r"); got != "" {
		t.Fatalf("segments %q", got)
	}
}

// A host cut off from the fleet (its lease revoked) whose executing run
// another host took before it rejoined destroys the run's sandbox here,
// without an append, once rejoined (fleet.go's heldRun.Drop).
func TestFleetRejoinDropsRunTakenElsewhere(t *testing.T) {
	c := etcdtest.Shared(t)
	cli := c.Client(t)
	dir := fleet.New(cli, "/rejointaken/", 5*time.Second)
	a, b := joinFleet(t, dir, "a"), joinFleet(t, dir, "b")
	dropped := make(chan string, 1)
	h := newFakeHost(t, func(d *Daemon) {
		d.log = slog.New(warnsTo{d.log.Handler(), "another host took the run", dropped})
	})
	ctx := t.Context()
	var taken sync.Once
	inFleet(h.d, a, func(ctx context.Context) (*fleet.Session, error) {
		// Before this host is first back, b takes the run its lease left.
		taken.Do(func() {
			run, err := h.d.st.Run("r")
			if err == nil {
				_, err = b.Claim(ctx, record.Genesis(run.Unit, run.Grants), "r", run.Head, record.PhaseExecuting)
			}
			if err != nil {
				t.Error(err)
			}
		})
		nh, err := dir.Join(ctx, a.Key(), 10*time.Second)
		if err == nil {
			t.Cleanup(func() { _ = nh.Close(context.Background()) })
		}
		return nh, err
	})
	h.d.fleet.WatchLease(h.d.bgCtx, &h.d.bg)
	h.start(t, "r")
	head, _ := h.d.st.Head("r")
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(a.Lease())); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dropped:
	case <-time.After(30 * time.Second):
		t.Fatal("the run another host took was not dropped")
	}
	h.heldElsewhere(t, dir, "r", head, b)
	if lv := h.liveOf("r"); lv != nil {
		t.Fatal("the run keeps a sandbox here")
	}
	if got := h.kinds(t, "r"); got != "" {
		t.Fatalf("segments %q", got)
	}
}
