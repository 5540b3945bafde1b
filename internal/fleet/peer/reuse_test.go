package peer

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
)

// TestHostsReuse: with Reuse, a host's calls to one peer share one TLS
// connection; without it, each call makes its own. Every call still reads
// the peer's membership, so a peer that left is refused even with a
// connection open.
func TestHostsReuse(t *testing.T) {
	c := etcdtest.Start(t)
	d := fleet.New(c.Client(t), "/t/reuse/", 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srvKey, me := newKey(t), newKey(t)
	if err := d.Admit(ctx, idOf(srvKey), "srv", fleet.RoleHost); err != nil {
		t.Fatal(err)
	}
	if err := d.Admit(ctx, idOf(me), "me", fleet.RoleHost); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen("127.0.0.1:0", ServerConfig(srvKey, Members(d)), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/migrations", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") })
	srv := &http.Server{Handler: mux, ErrorLog: log.New(io.Discard, "", 0), ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close(); <-done }()
	s, err := d.JoinAt(ctx, idOf(srvKey), 10*time.Second, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name  string
		reuse *Reuse
		want  int64
	}{{"Reuse", NewReuse(), 1}, {"PerCall", nil, 3}} {
		conns.Store(0)
		h := Hosts{Dir: d, Key: me, Reuse: c.reuse}
		for range 3 {
			if _, err := h.Hand(ctx, idOf(srvKey), Migration{Run: "r"}); err != nil {
				t.Fatalf("%s: hand: %v", c.name, err)
			}
		}
		if n := conns.Load(); n != c.want {
			t.Errorf("%s: %d connections for 3 calls, want %d", c.name, n, c.want)
		}
		if c.reuse != nil {
			c.reuse.Close()
		}
	}

	reuse := NewReuse()
	defer reuse.Close()
	h := Hosts{Dir: d, Key: me, Reuse: reuse}
	if _, err := h.Hand(ctx, idOf(srvKey), Migration{Run: "r"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hand(ctx, idOf(srvKey), Migration{Run: "r"}); err == nil {
		t.Fatal("a call to a peer whose session ended went through on the open connection")
	}
}
