package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/tlskey"
)

func fleetOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := cmdFleet(args, &out)
	return strings.TrimSpace(out.String()), err
}

// `fleet key --tls-out DIR` writes a PEM pair a TLS library loads, of
// the key id it prints; again, the same key; a key file others may read
// is refused. `fleet key --public` prints the raw key whose BLAKE3 is the
// host's key id.
func TestFleetKeyTLSOut(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "platform")
	id, err := fleetOut(t, "key", "--tls-out", dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tlskey.KeyOf([]*x509.Certificate{leaf}); err != nil || got.String() != id {
		t.Fatalf("certificate of %v (%v), printed %s", got, err, id)
	}
	if leaf.NotAfter.Sub(leaf.NotBefore) < tlsOutValidity {
		t.Fatalf("valid %v to %v: not long-lived", leaf.NotBefore, leaf.NotAfter)
	}
	if again, err := fleetOut(t, "key", "--tls-out", dir); err != nil || again != id {
		t.Fatalf("again: %s (%v), want the same key %s", again, err, id)
	}
	if err := os.Chmod(filepath.Join(dir, "key.pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fleetOut(t, "key", "--tls-out", dir); err == nil {
		t.Fatal("a key readable by others was used")
	}

	state := t.TempDir()
	pub, err := fleetOut(t, "key", "--public", "--state-dir", state)
	if err != nil {
		t.Fatal(err)
	}
	hostID, err := fleetOut(t, "key", "--state-dir", state)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := hex.DecodeString(pub)
	if err != nil || len(raw) != ed25519.PublicKeySize || attest.KeyID(raw).String() != hostID {
		t.Fatalf("--public %q (%v) is not the key of %s", pub, err, hostID)
	}
	if _, err := fleetOut(t, "key", "--public", "--tls-out", dir); err == nil {
		t.Fatal("--public with --tls-out: no usage error")
	}
}
