package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/tlskey"
)

// A platform key for clients without ed25519 certificate tooling
// (docs/clients.md): `fleet key --tls-out DIR` keeps the key in DIR/key.pem
// and writes DIR/cert.pem, a long-lived certificate of it; `fleet key
// --public` prints the host key as such clients pin it.

// tlsOutValidity is how long a --tls-out certificate is valid. The
// listener never checks dates (the key is what is admitted, and revoking
// it ends it); the dates are there for TLS libraries that check their
// own certificate.
const tlsOutValidity = 10 * 365 * 24 * time.Hour

// Their names in DIR.
const (
	tlsOutKey  = "key.pem"
	tlsOutCert = "cert.pem"
)

// fleetTLSOut makes the platform key in dir (or reuses the one there),
// writes its certificate, and returns its key id, to admit with `fleet
// admit KEY --role platform`.
func fleetTLSOut(dir string) (record.Address, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return record.Address{}, err
	}
	key, err := loadOrCreatePEMKey(filepath.Join(dir, tlsOutKey))
	if err != nil {
		return record.Address{}, err
	}
	now := time.Now()
	cert, err := tlskey.Certificate(key, now.Add(-time.Hour), now.Add(tlsOutValidity))
	if err != nil {
		return record.Address{}, err
	}
	err = atomicfile.Write(filepath.Join(dir, tlsOutCert), 0o644, func(f *os.File) error {
		return pem.Encode(f, &pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	})
	if err != nil {
		return record.Address{}, err
	}
	return attest.KeyID(key.Public().(ed25519.PublicKey)), nil
}

// loadOrCreatePEMKey reads the ed25519 key at path (PKCS #8, PEM), or
// makes one there (mode 0600, durably) when there is none. A key
// readable by group or others, or of another kind, is refused.
func loadOrCreatePEMKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		err = atomicfile.Create(path, 0o600, func(f *os.File) error {
			return pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
		})
		if errors.Is(err, fs.ErrExist) {
			return loadOrCreatePEMKey(path) // another run made it meanwhile: its key
		}
		return key, err
	}
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %v: must not be readable by group or others", path, st.Mode().Perm())
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: not a PEM private key (PKCS #8)", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: a %T key, want ed25519", path, k)
	}
	return key, nil
}

// hostPublicKey is the raw ed25519 public key (hex) of the host key in a
// state directory, making the key when there is none: what a client
// without BLAKE3 pins (its key id is the BLAKE3 of these bytes).
func hostPublicKey(state string) (string, error) {
	if err := os.MkdirAll(state, 0o700); err != nil {
		return "", err
	}
	key, err := attest.LoadOrCreateKey(filepath.Join(state, "host.key"))
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(key.Public().(ed25519.PublicKey)), nil
}
