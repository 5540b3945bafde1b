package etcdtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Secure is what a cluster started with client TLS and authentication
// needs and gives: a CA made for it, the members' serving certificate, a
// client certificate, and the root user's password. Its files are PEM,
// under Dir: ca.pem, server.pem, server-key.pem, client.pem,
// client-key.pem.
//
// The client certificate's common name names no user, so a client must
// also give a user and password: etcd takes a password over the
// certificate's name.
type Secure struct {
	Dir          string
	RootPassword string
}

// The file names of a Secure's PEM files.
const (
	CAFile         = "ca.pem"
	ServerCertFile = "server.pem"
	ServerKeyFile  = "server-key.pem"
	ClientCertFile = "client.pem"
	ClientKeyFile  = "client-key.pem"
)

// NewSecure makes a CA and, signed by it, a serving certificate for
// 127.0.0.1 and a client certificate, into dir; each valid for a day.
func NewSecure(dir string) (*Secure, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdtest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, err
	}
	if err := writePEM(filepath.Join(dir, CAFile), "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	for i, c := range []struct {
		cert, key string
		tmpl      x509.Certificate
	}{
		{ServerCertFile, ServerKeyFile, x509.Certificate{Subject: pkix.Name{CommonName: "etcdtest member"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}},
		{ClientCertFile, ClientKeyFile, x509.Certificate{Subject: pkix.Name{CommonName: "etcdtest client"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		t := c.tmpl
		t.SerialNumber = big.NewInt(int64(i + 2))
		t.NotBefore, t.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		t.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, &t, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := writePEM(filepath.Join(dir, c.cert), "CERTIFICATE", der); err != nil {
			return nil, err
		}
		if err := writePEM(filepath.Join(dir, c.key), "EC PRIVATE KEY", kder); err != nil {
			return nil, err
		}
	}
	pw := make([]byte, 12)
	_, _ = rand.Read(pw)
	return &Secure{Dir: dir, RootPassword: fmt.Sprintf("root-%x", pw)}, nil
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

// Path is the path of one of s's files.
func (s *Secure) Path(name string) string { return filepath.Join(s.Dir, name) }

// serverTLS is the members' client-side TLS: their certificate, and
// client certificates required, signed by the CA.
func (s *Secure) serverTLS() transport.TLSInfo {
	return transport.TLSInfo{CertFile: s.Path(ServerCertFile), KeyFile: s.Path(ServerKeyFile),
		TrustedCAFile: s.Path(CAFile), ClientCertAuth: true}
}

// ClientConfig is a client's configuration of endpoints, with the client
// certificate and user's password.
func (s *Secure) ClientConfig(endpoints []string, user, password string) (clientv3.Config, error) {
	tlsInfo := transport.TLSInfo{CertFile: s.Path(ClientCertFile), KeyFile: s.Path(ClientKeyFile), TrustedCAFile: s.Path(CAFile)}
	tc, err := tlsInfo.ClientConfig()
	if err != nil {
		return clientv3.Config{}, err
	}
	return clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		TLS: tc, Username: user, Password: password}, nil
}

// Grant makes user, with password, able to read and write every key
// under prefix and to use leases there: a role of the same name holds the
// permission. It runs as root.
func (c *Cluster) Grant(ctx context.Context, user, password, prefix string) error {
	if c.secure == nil {
		return fmt.Errorf("etcdtest: the cluster has no authentication to grant in")
	}
	cli, err := c.rootClient()
	if err != nil {
		return fmt.Errorf("etcdtest: root client: %w", err)
	}
	defer cli.Close()
	if _, err := cli.RoleAdd(ctx, user); err != nil {
		return fmt.Errorf("etcdtest: role add %s: %w", user, err)
	}
	if _, err := cli.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(authpb.READWRITE)); err != nil {
		return fmt.Errorf("etcdtest: grant %s: %w", user, err)
	}
	if _, err := cli.UserAdd(ctx, user, password); err != nil {
		return fmt.Errorf("etcdtest: user add %s: %w", user, err)
	}
	if _, err = cli.UserGrantRole(ctx, user, user); err != nil {
		return fmt.Errorf("etcdtest: user grant-role %s: %w", user, err)
	}
	return nil
}

// rootClient is a client of every member as root (with the cluster's TLS
// and root password when it has them).
func (c *Cluster) rootClient() (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	if c.secure != nil {
		var err error
		if cfg, err = c.secure.ClientConfig(c.Endpoints(), "root", c.secure.RootPassword); err != nil {
			return nil, err
		}
	}
	return clientv3.New(cfg)
}

// enableAuth adds the root user and switches authentication on.
func (c *Cluster) enableAuth(ctx context.Context) error {
	cfg, err := c.secure.ClientConfig(c.Endpoints(), "", "")
	if err != nil {
		return err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.UserAdd(ctx, "root", c.secure.RootPassword); err != nil {
		return fmt.Errorf("user add root: %w", err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("user grant-role root: %w", err)
	}
	if _, err = cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("auth enable: %w", err)
	}
	return nil
}

// SpawnSecure is [Spawn] with client TLS and authentication: the members
// serve clients over https with s's certificate and require a client
// certificate signed by s's CA, and authentication is on, with root's
// password s.RootPassword ([Cluster.Grant] adds users). Peers talk plain
// HTTP among themselves on 127.0.0.1.
func SpawnSecure(binary string, dir func() string, s *Secure) (*Cluster, error) {
	c, err := spawnWith(binary, dir, s)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.enableAuth(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("etcdtest: enable authentication: %w", err)
	}
	return c, nil
}
