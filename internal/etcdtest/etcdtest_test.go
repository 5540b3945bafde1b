package etcdtest

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"testing"
	"time"
)

// TestCluster writes through a three-member cluster, keeps writing with
// one member stopped, reads the write back from the restarted member, and
// checks that Close leaves no member listening. The cluster is the shared
// one: a second Shared returns it, a member left stopped is restarted by
// the next Shared, one stopped with StopFor is running again once its
// test ends, and CloseShared stops every member and removes their data.
func TestCluster(t *testing.T) {
	c := Shared(t)
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

	if Shared(t) != c {
		t.Fatal("a second Shared made another cluster")
	}
	if !c.Running(2) {
		t.Fatal("Shared did not restart the member left stopped")
	}
	one := NewClient(t, c.Endpoint(2))
	r, err := one.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get from the restarted member: %v", err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatalf("restarted member reads %v, want v2", r.Kvs)
	}

	t.Run("StopFor", func(t *testing.T) {
		c.StopFor(t, 1)
		if c.Running(1) {
			t.Fatal("member 1 running after StopFor")
		}
	})
	if !c.Running(1) {
		t.Fatal("member 1 not restarted at the end of the test that stopped it")
	}

	dir := shared.dir
	CloseShared()
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
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CloseShared left the members' data in %s: %v", dir, err)
	}
	c.Close() // again: nothing to do
}
