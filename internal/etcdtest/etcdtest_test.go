package etcdtest

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestCluster writes through a three-member cluster, keeps writing with
// one member stopped, reads the write back from the restarted member, and
// checks that Close leaves no member listening.
func TestCluster(t *testing.T) {
	c := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := c.Client(t)
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatalf("put with three members: %v", err)
	}

	c.Stop(2)
	if c.Running(2) {
		t.Fatal("member 2 still running after Stop")
	}
	if _, err := cli.Put(ctx, "k", "v2"); err != nil {
		t.Fatalf("put with two of three members: %v", err)
	}

	c.Restart(t, 2)
	c.WaitHealthy(ctx, t)
	one := NewClient(t, c.Endpoint(2))
	r, err := one.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get from the restarted member: %v", err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatalf("restarted member reads %v, want v2", r.Kvs)
	}

	c.Close()
	for i := range Members {
		conn, err := net.DialTimeout("tcp", c.members[i].client.Host, time.Second)
		if err == nil {
			_ = conn.Close()
			t.Errorf("member %d still accepts connections after Close", i)
		}
		conn, err = net.DialTimeout("tcp", c.members[i].peerURL.Host, time.Second)
		if err == nil {
			_ = conn.Close()
			t.Errorf("member %d's peer port still accepts connections after Close", i)
		}
	}
	c.Close() // again: nothing to do
}
