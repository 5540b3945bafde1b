package peer

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
)

// TestFleetDir: admission backed by the fleet's directory in a real
// 3-member etcd cluster. Admitted keys pass with their roles, others are
// refused; when etcd cannot confirm (a client of a closed port, then the
// whole cluster stopped) the handshake is refused as unconfirmed.
func TestFleetDir(t *testing.T) {
	c := etcdtest.Start(t)
	d := fleet.New(c.Client(t), "/t/peer/", 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srvKey, h, p, stranger := newKey(t), newKey(t), newKey(t), newKey(t)
	if err := d.Admit(ctx, idOf(h), "h", fleet.RoleHost); err != nil {
		t.Fatal(err)
	}
	if err := d.Admit(ctx, idOf(p), "p", fleet.RolePlatform); err != nil {
		t.Fatal(err)
	}
	ps := serve(t, srvKey, Members(d))
	mustGet(t, ps, h, "/host", http.StatusOK)
	mustGet(t, ps, p, "/platform", http.StatusOK)
	mustGet(t, ps, p, "/host", http.StatusForbidden)
	mustGet(t, ps, h, "/platform", http.StatusForbidden)
	refusedHandshake(t, ps, ClientConfig(stranger, ps.key))
	if re := ps.lastRefusal(t); re.Key != idOf(stranger) || !errors.Is(re, ErrNotAdmitted) || errors.Is(re, ErrUnconfirmed) {
		t.Fatalf("stranger: %v, want ErrNotAdmitted", re)
	}

	t.Run("ClosedPort", func(t *testing.T) {
		closed := fleet.New(etcdtest.NewClient(t, "http://127.0.0.1:1"), "/t/peer/", 500*time.Millisecond)
		ps := serve(t, srvKey, Members(closed))
		refusedHandshake(t, ps, ClientConfig(h, ps.key))
		unconfirmed(t, ps)
	})

	t.Run("ClusterStopped", func(t *testing.T) {
		c.Close()
		refusedHandshake(t, ps, ClientConfig(h, ps.key))
		unconfirmed(t, ps)
		if n := ps.served.Load(); n != 2 {
			t.Fatalf("%d requests reached a handler, want the 2 before", n)
		}
	})
}

func unconfirmed(t *testing.T, ps *peerServer) {
	t.Helper()
	re := ps.lastRefusal(t)
	if !errors.Is(re, ErrUnconfirmed) || !errors.Is(re, fleet.ErrUnavailable) || errors.Is(re, ErrNotAdmitted) {
		t.Fatalf("refusal %v, want ErrUnconfirmed wrapping fleet.ErrUnavailable", re)
	}
}
