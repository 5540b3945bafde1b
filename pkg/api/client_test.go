package api_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/tlskey"
)

func newCert(t *testing.T) (*tls.Certificate, record.Address) {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c, err := tlskey.Certificate(key, now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return c, attest.KeyID(key.Public().(ed25519.PublicKey))
}

// A TLS client presents its platform key's certificate and reaches a
// server holding the pinned key; pinned to another key, it is refused
// (tlskey.ErrPin) before it sends anything.
func TestTLSClient(t *testing.T) {
	serverCert, serverKey := newCert(t)
	clientCert, clientKey := newCert(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server sees the client's key (as the peer listener's
		// admission does).
		id, err := tlskey.KeyOf(r.TLS.PeerCertificates)
		if err != nil || id != clientKey {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(api.Error{Code: api.CodeForbidden, Message: "not the client's key"})
			return
		}
		_ = json.NewEncoder(w).Encode([]api.Run{{ID: "r1"}})
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*serverCert}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	ctx := context.Background()

	runs, err := api.NewTLSClient(api.TLS{Addr: addr, Certificate: *clientCert, Host: serverKey}).List(ctx, "")
	if err != nil || len(runs) != 1 || runs[0].ID != "r1" {
		t.Fatalf("pinned to the server's key: %+v, %v", runs, err)
	}
	_, err = api.NewTLSClient(api.TLS{Addr: addr, Certificate: *clientCert, Host: clientKey}).List(ctx, "")
	if !errors.Is(err, tlskey.ErrPin) {
		t.Fatalf("pinned to another key: %v, want ErrPin", err)
	}
}
