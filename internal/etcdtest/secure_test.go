package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A cluster with client TLS and authentication: a granted user over TLS
// writes under its prefix and nowhere else; the same certificate without
// the password, a wrong password, and a client without TLS are refused.
func TestSecure(t *testing.T) {
	s, err := NewSecure(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := SpawnSecure("", t.TempDir, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Grant(ctx, "app", "app-password", "/app/"); err != nil {
		t.Fatal(err)
	}
	client := func(user, password string) *clientv3.Client {
		cfg, err := s.ClientConfig(c.Endpoints(), user, password)
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			t.Fatalf("client as %q: %v", user, err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	put := func(cli *clientv3.Client, key string) error {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := cli.Put(pctx, key, "v")
		return err
	}
	app := client("app", "app-password")
	if err := put(app, "/app/x"); err != nil {
		t.Fatalf("the granted user under its prefix: %v", err)
	}
	if err := put(app, "/other/x"); err == nil {
		t.Fatal("the granted user wrote outside its prefix")
	}
	if err := put(client("", ""), "/app/y"); err == nil {
		t.Fatal("a client with the certificate and no password wrote")
	}
	if cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: time.Second}); err == nil {
		t.Cleanup(func() { _ = cli.Close() })
		if err := put(cli, "/app/z"); err == nil {
			t.Fatal("a client without TLS wrote")
		}
	}
	// A wrong password fails at the client's first authentication, in New
	// or at its first request.
	if cli, err := clientv3.New(mustConfig(t, s, c, "app", "wrong")); err == nil {
		t.Cleanup(func() { _ = cli.Close() })
		if err := put(cli, "/app/w"); err == nil {
			t.Fatal("a wrong password wrote")
		}
	}
	if r, err := c.Client(t).Get(ctx, "/app/x"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("root reads: %v, %v", r, err)
	}
}

func mustConfig(t *testing.T, s *Secure, c *Cluster, user, password string) clientv3.Config {
	t.Helper()
	cfg, err := s.ClientConfig(c.Endpoints(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
