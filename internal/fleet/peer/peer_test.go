package peer

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func idOf(k ed25519.PrivateKey) record.Address { return attest.KeyID(k.Public().(ed25519.PublicKey)) }

// roles is an Admitted backed by a map.
func roles(m map[record.Address]fleet.Role) Admitted {
	return func(_ context.Context, key record.Address) (fleet.Role, error) {
		r, ok := m[key]
		if !ok {
			return "", fmt.Errorf("host %s: %w", key, fleet.ErrNotAdmitted)
		}
		return r, nil
	}
}

// peerServer is a peer listener on 127.0.0.1 serving /host (host keys)
// and /platform (platform keys), each answering "KEYID ROLE".
type peerServer struct {
	addr    string
	key     record.Address
	served  atomic.Int64 // requests that reached a handler
	mu      sync.Mutex
	refused []error       // errors of VerifyConnection, in order
	closed  chan struct{} // a connection closed
}

func serve(t *testing.T, key ed25519.PrivateKey, admitted Admitted) *peerServer {
	t.Helper()
	ps := &peerServer{key: idOf(key), closed: make(chan struct{}, 100)}
	cfg := ServerConfig(key, admitted)
	// Each handshake verifies with the configuration GetConfigForClient
	// makes for it (its admission bounded by the handshake's context).
	get := cfg.GetConfigForClient
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := get(hello)
		if err != nil {
			return nil, err
		}
		verify := c.VerifyConnection
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			err := verify(cs)
			if err != nil {
				ps.mu.Lock()
				ps.refused = append(ps.refused, err)
				ps.mu.Unlock()
			}
			return err
		}
		return c, nil
	}
	ln, err := Listen("127.0.0.1:0", cfg, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ps.addr = ln.Addr().String()
	whoami := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ps.served.Add(1)
		k, role, _ := KeyOf(r)
		fmt.Fprintf(w, "%s %s", k, role)
	})
	mux := http.NewServeMux()
	mux.Handle("/host", Require(fleet.RoleHost, whoami))
	mux.Handle("/platform", Require(fleet.RolePlatform, whoami))
	srv := &http.Server{Handler: mux, ErrorLog: log.New(io.Discard, "", 0), ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				select {
				case ps.closed <- struct{}{}:
				default:
				}
			}
		}}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ps
}

// lastRefusal returns the server's last handshake refusal.
func (ps *peerServer) lastRefusal(t *testing.T) *RefusedError {
	t.Helper()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.refused) == 0 {
		t.Fatal("the server refused no handshake")
	}
	var re *RefusedError
	if !errors.As(ps.refused[len(ps.refused)-1], &re) {
		t.Fatalf("refusal %v is not a *RefusedError", ps.refused[len(ps.refused)-1])
	}
	return re
}

// get requests path from ps as key, pinned to ps's key, on a new
// connection, and returns the status and body.
func get(t *testing.T, ps *peerServer, key ed25519.PrivateKey, path string) (int, string, error) {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: ClientConfig(key, ps.key), DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get("https://" + ps.addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// mustGet is get that must succeed with want.
func mustGet(t *testing.T, ps *peerServer, key ed25519.PrivateKey, path string, want int) string {
	t.Helper()
	status, body, err := get(t, ps, key, path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if status != want {
		t.Fatalf("GET %s: %d %s, want %d", path, status, body, want)
	}
	return body
}

// refusedHandshake dials ps with cfg, completes the client's side of the
// handshake, then reads: a server that refuses the client's certificate
// answers with an alert (TLS 1.3 checks the client after the client has
// finished). Nothing is written, so the server's close cannot reset the
// connection before the alert is read.
func refusedHandshake(t *testing.T, ps *peerServer, cfg *tls.Config) {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", ps.addr, cfg)
	if err == nil {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || !strings.Contains(err.Error(), "tls:") {
		t.Fatalf("handshake: %v, want a TLS alert from the server", err)
	}
	t.Logf("client: %v", err)
}

// TestAdmittedHost: an admitted host key reaches a host route, and the
// handler sees its key id and role.
func TestAdmittedHost(t *testing.T) {
	srvKey, a := newKey(t), newKey(t)
	ps := serve(t, srvKey, roles(map[record.Address]fleet.Role{idOf(a): fleet.RoleHost}))
	if got, want := mustGet(t, ps, a, "/host", http.StatusOK), idOf(a).String()+" host"; got != want {
		t.Fatalf("handler saw %q, want %q", got, want)
	}
}

// TestUnadmittedRefused: a key the fleet does not admit is refused at the
// handshake; no handler runs.
func TestUnadmittedRefused(t *testing.T) {
	srvKey, a, stranger := newKey(t), newKey(t), newKey(t)
	ps := serve(t, srvKey, roles(map[record.Address]fleet.Role{idOf(a): fleet.RoleHost}))
	refusedHandshake(t, ps, ClientConfig(stranger, ps.key))
	if re := ps.lastRefusal(t); re.Key != idOf(stranger) || !errors.Is(re, ErrNotAdmitted) {
		t.Fatalf("refusal %v, want ErrNotAdmitted for %s", re, idOf(stranger))
	}
	if _, _, err := get(t, ps, stranger, "/host"); err == nil {
		t.Fatal("an unadmitted key got an answer")
	}
	if n := ps.served.Load(); n != 0 {
		t.Fatalf("%d requests reached a handler", n)
	}
}

// TestUnknownRole: a role other than host or platform admits nothing.
func TestUnknownRole(t *testing.T) {
	srvKey, a := newKey(t), newKey(t)
	ps := serve(t, srvKey, roles(map[record.Address]fleet.Role{idOf(a): "root"}))
	refusedHandshake(t, ps, ClientConfig(a, ps.key))
	if re := ps.lastRefusal(t); !errors.Is(re, ErrNotAdmitted) {
		t.Fatalf("refusal %v, want ErrNotAdmitted", re)
	}
}

// TestRoles: a platform key gets 403 on a host route and passes on a
// platform route; a host key the other way round.
func TestRoles(t *testing.T) {
	srvKey, h, p := newKey(t), newKey(t), newKey(t)
	ps := serve(t, srvKey, roles(map[record.Address]fleet.Role{idOf(h): fleet.RoleHost, idOf(p): fleet.RolePlatform}))
	for _, c := range []struct {
		key       ed25519.PrivateKey
		ok, wrong string
	}{{h, "/host", "/platform"}, {p, "/platform", "/host"}} {
		mustGet(t, ps, c.key, c.ok, http.StatusOK)
		body := mustGet(t, ps, c.key, c.wrong, http.StatusForbidden)
		var e api.Error
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != CodeForbidden || !strings.Contains(e.Message, idOf(c.key).String()) {
			t.Fatalf("403 body %q (%v), want code %q naming the key", body, err, CodeForbidden)
		}
	}
	if n := ps.served.Load(); n != 2 {
		t.Fatalf("%d requests reached a handler, want 2", n)
	}
}

// TestPin: a client pinned to key A refuses a server presenting key B,
// before it sends anything.
func TestPin(t *testing.T) {
	a, b, client := newKey(t), newKey(t), newKey(t)
	ps := serve(t, b, roles(map[record.Address]fleet.Role{idOf(client): fleet.RoleHost}))
	c, err := tls.Dial("tcp", ps.addr, ClientConfig(client, idOf(a)))
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, ErrPin) {
		t.Fatalf("dial of B pinned to A: %v, want ErrPin", err)
	}
	ps.key = idOf(a) // what get pins
	if _, _, err := get(t, ps, client, "/host"); !errors.Is(err, ErrPin) {
		t.Fatalf("GET from B pinned to A: %v, want ErrPin", err)
	}
	if n := ps.served.Load(); n != 0 {
		t.Fatalf("%d requests reached a handler", n)
	}
	ps.key = idOf(b)
	mustGet(t, ps, client, "/host", http.StatusOK)
}

// TestCertificateRefused: a client without a certificate, or with one of
// another key type, is refused at the handshake.
func TestCertificateRefused(t *testing.T) {
	srvKey := newKey(t)
	ps := serve(t, srvKey, roles(nil))
	noCert := ClientConfig(newKey(t), ps.key)
	noCert.GetClientCertificate = nil
	refusedHandshake(t, ps, noCert)

	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: bigOne(), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ec.PublicKey, ec)
	if err != nil {
		t.Fatal(err)
	}
	ecCert := ClientConfig(newKey(t), ps.key)
	ecCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: ec}, nil
	}
	refusedHandshake(t, ps, ecCert)
	if re := ps.lastRefusal(t); !errors.Is(re, ErrCertificate) || !re.Key.IsZero() {
		t.Fatalf("refusal %v, want ErrCertificate with no key", re)
	}
	if n := ps.served.Load(); n != 0 {
		t.Fatalf("%d requests reached a handler", n)
	}
}

// TestKeyOfOnlyAdmitted: a request over TLS whose client certificate was
// not admitted by a ServerConfig (here: any certificate accepted) has no
// key, and Require forbids it.
func TestKeyOfOnlyAdmitted(t *testing.T) {
	srvKey, client := newKey(t), newKey(t)
	cfg := ServerConfig(srvKey, roles(nil))
	cfg.VerifyConnection, cfg.GetConfigForClient = nil, nil // checked by nobody
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Require(fleet.RoleHost, http.NotFoundHandler()), ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	ps := &peerServer{addr: ln.Addr().String(), key: idOf(srvKey)}
	body := mustGet(t, ps, client, "/host", http.StatusForbidden)
	if !strings.Contains(body, CodeForbidden) {
		t.Fatalf("body %q", body)
	}
}

// TestListenRefusesOtherConfigs: Listen serves only a ServerConfig.
func TestListenRefusesOtherConfigs(t *testing.T) {
	k := newKey(t)
	for name, mod := range map[string]func(*tls.Config){
		"no client auth":    func(c *tls.Config) { c.ClientAuth = tls.NoClientCert },
		"no verification":   func(c *tls.Config) { c.VerifyConnection = nil },
		"fixed certificate": func(c *tls.Config) { c.Certificates = []tls.Certificate{{}} },
	} {
		cfg := ServerConfig(k, roles(nil))
		mod(cfg)
		if ln, err := Listen("127.0.0.1:0", cfg, Limits{}); err == nil {
			ln.Close()
			t.Errorf("%s: served", name)
		}
	}
	if _, err := Listen("127.0.0.1:0", nil, Limits{}); err == nil {
		t.Error("nil config served")
	}
}

// TestVerdictLifetime: the verdict of a handshake serves every request of
// its connection, garbage collections notwithstanding, and goes once the
// connection is closed and collected (nothing kept per connection).
func TestVerdictLifetime(t *testing.T) {
	srvKey, h := newKey(t), newKey(t)
	ps := serve(t, srvKey, roles(map[record.Address]fleet.Role{idOf(h): fleet.RoleHost}))
	tr := &http.Transport{TLSClientConfig: ClientConfig(h, ps.key), MaxConnsPerHost: 1}
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var conns atomic.Int64
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conns.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	for i := range 3 {
		runtime.GC()
		resp, err := c.Get("https://" + ps.addr + "/host")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1 (keep-alive)", n)
	}
	if n := verdictsOf(idOf(h)); n != 1 {
		t.Fatalf("%d verdicts kept for the key, want 1", n)
	}
	tr.CloseIdleConnections()
	select {
	case <-ps.closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not see the connection close")
	}
	// The cleanups run after a collection finds the certificate
	// unreachable.
	for i := 0; verdictsOf(idOf(h)) != 0; i++ {
		if i == 1000 {
			t.Fatal("the verdict of a closed connection is still kept")
		}
		runtime.GC()
		runtime.Gosched()
	}
}

func verdictsOf(key record.Address) int {
	n := 0
	verdicts.Range(func(_, v any) bool {
		if v.(verdict).key == key {
			n++
		}
		return true
	})
	return n
}

// TestStolenCertificate: a certificate is public; presenting an admitted
// or pinned key's certificate without holding the key fails the
// handshake, on either side.
func TestStolenCertificate(t *testing.T) {
	srvKey, h, thief := newKey(t), newKey(t), newKey(t)
	ps := serve(t, srvKey, roles(map[record.Address]fleet.Role{idOf(h): fleet.RoleHost}))
	stolen := func(of ed25519.PrivateKey) *tls.Certificate {
		c, err := selfSigned(of, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		c.PrivateKey = thief
		return c
	}
	cfg := ClientConfig(thief, ps.key)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return stolen(h), nil }
	refusedHandshake(t, ps, cfg)
	ps.mu.Lock()
	if len(ps.refused) != 0 {
		t.Errorf("refused as %v; the key is admitted, its signature is what fails", ps.refused)
	}
	ps.mu.Unlock()

	// A server presenting the pinned key's certificate, signing with
	// another key.
	scfg := ServerConfig(thief, roles(map[record.Address]fleet.Role{idOf(h): fleet.RoleHost}))
	scfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return stolen(srvKey), nil }
	fake := serveConfig(t, scfg)
	c, err := tls.Dial("tcp", fake, ClientConfig(h, idOf(srvKey)))
	if err == nil {
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "invalid signature") {
		t.Fatalf("handshake with a server without the pinned key: %v, want an invalid signature", err)
	}
	if n := ps.served.Load(); n != 0 {
		t.Fatalf("%d requests reached a handler", n)
	}
}

// serveConfig serves 404s with cfg on 127.0.0.1 and returns the address.
func serveConfig(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", cfg, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ErrorLog: log.New(io.Discard, "", 0), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}
