package peer

import (
	"crypto/ed25519"
	"crypto/x509"
	"math/big"
	"testing"
	"time"
)

func bigOne() *big.Int { return big.NewInt(1) }

// TestCertificate: the certificate is self-signed by the host key, names
// its key id, has the documented validity, and is remade before it runs
// out.
func TestCertificate(t *testing.T) {
	key := newKey(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := newCertSource(key)
	s.now = func() time.Time { return now }
	c, err := s.get()
	if err != nil {
		t.Fatal(err)
	}
	leaf := c.Leaf
	if pub, ok := leaf.PublicKey.(ed25519.PublicKey); !ok || !pub.Equal(key.Public()) {
		t.Fatalf("certificate key %v", leaf.PublicKey)
	}
	if err := leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature); err != nil {
		t.Fatalf("not self-signed: %v", err)
	}
	if leaf.Subject.CommonName != idOf(key).String() {
		t.Fatalf("common name %q", leaf.Subject.CommonName)
	}
	if !leaf.NotBefore.Equal(now.Add(-certBackdate)) || !leaf.NotAfter.Equal(now.Add(CertValidity)) {
		t.Fatalf("valid %v to %v", leaf.NotBefore, leaf.NotAfter)
	}
	if id, err := keyOf([]*x509.Certificate{leaf}); err != nil || id != idOf(key) {
		t.Fatalf("keyOf = %v, %v", id, err)
	}
	now = now.Add(CertValidity - certRenew - time.Second)
	if again, _ := s.get(); again != c {
		t.Fatal("remade with more than certRenew left")
	}
	now = now.Add(2 * time.Second)
	again, err := s.get()
	if err != nil || again == c || !again.Leaf.NotAfter.Equal(now.Add(CertValidity)) {
		t.Fatalf("not remade with less than certRenew left: %v", err)
	}
	if _, err := selfSigned(key[:10], now); err == nil {
		t.Fatal("a short key made a certificate")
	}
}
