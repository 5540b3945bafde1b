package peer

import (
	"crypto/ed25519"
	"io"
	"log"
	"net/http"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Cut closes a key's open connection, a request on it fails, and the
// key's next connection is closed as it becomes active, though its
// handshake passes, until the key is admitted again. Another key's
// connection goes on.
func TestConnsCut(t *testing.T) {
	server, a, b := newKey(t), newKey(t), newKey(t)
	ln, err := Listen("127.0.0.1:0", ServerConfig(server, roles(map[record.Address]fleet.Role{
		idOf(a): fleet.RolePlatform, idOf(b): fleet.RolePlatform})), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	conns := &Conns{}
	srv := &http.Server{ConnState: conns.Track, ErrorLog: log.New(io.Discard, "", 0), ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	client := func(key ed25519.PrivateKey) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: ClientConfig(key, idOf(server))}}
	}
	ca, cb := client(a), client(b)
	get := func(c *http.Client) error {
		resp, err := c.Get("https://" + ln.Addr().String() + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return err
	}
	for _, c := range []*http.Client{ca, cb} {
		if err := get(c); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Cut(idOf(a)); n != 1 {
		t.Fatalf("Cut closed %d connections of a, want its 1", n)
	}
	if err := get(ca); err == nil {
		t.Fatal("a request of a cut key was served")
	}
	if err := get(cb); err != nil {
		t.Fatalf("another key's connection: %v", err)
	}
	if ks := conns.Keys(); len(ks) != 1 || ks[0] != idOf(b) {
		t.Fatalf("keys with connections: %v, want b's", ks)
	}
	conns.Admitted(idOf(a))
	if err := get(ca); err != nil {
		t.Fatalf("a key admitted again: %v", err)
	}
}
