package etcdtest

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"
)

// shared is the cluster [Shared] hands out, started by the first test of
// the process that asks for it.
var shared struct {
	sync.Mutex
	c      *Cluster
	binary string // the member program its members run; "" in this process
	dir    string // the members' data: os.MkdirTemp("", "etcdtest-")
	err    error  // why it did not start
}

// Shared returns one cluster for every test of the process that asks for
// it, started by the first of them: a cluster costs seconds to start and
// to close, a test on a settled one nothing. The caller's TestMain closes
// it with [CloseShared] after m.Run.
//
// Tests sharing it keep to key prefixes of their own. A test that stops a
// member restarts it in its cleanup ([Cluster.StopFor]); Shared restarts
// any member a failed test left stopped, and returns once every member
// answers a linearizable read, so each test starts from three members in
// quorum. Shared clusters are not for tests running in parallel with one
// that stops members.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	return SharedSpawned(t, "")
}

// SharedSpawned is [Shared] with each member a process of binary, the
// member program ([Spawn]). Every test of the process must ask for the
// same binary.
func SharedSpawned(t testing.TB, binary string) *Cluster {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if shared.c == nil && shared.err == nil {
		shared.c, shared.dir, shared.err = runShared(binary)
		shared.binary = binary
	}
	if shared.err == nil && shared.binary != binary {
		t.Fatalf("etcdtest: the shared cluster's members run %q, not %q", shared.binary, binary)
	}
	if shared.err != nil {
		t.Fatalf("etcdtest: the shared %d-member cluster: %v", Members, shared.err)
	}
	c := shared.c
	for i := range Members {
		if !c.Running(i) {
			t.Logf("etcdtest: member %d of the shared cluster was left stopped: restarting it", i)
			c.Restart(t, i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.WaitHealthy(ctx, t)
	return c
}

func runShared(binary string) (*Cluster, string, error) {
	root, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		return nil, "", err
	}
	var mkErr error
	c, err := Spawn(binary, func() string {
		d, err := os.MkdirTemp(root, "member-")
		mkErr = errors.Join(mkErr, err)
		return d
	})
	if err = errors.Join(err, mkErr); err != nil {
		if c != nil {
			c.Close()
		}
		_ = os.RemoveAll(root)
		return nil, "", err
	}
	return c, root, nil
}

// CloseShared closes the cluster [Shared] started, if any, and removes its
// data. Call it from TestMain after m.Run.
func CloseShared() {
	shared.Lock()
	defer shared.Unlock()
	if shared.c != nil {
		shared.c.Close()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	shared.c, shared.binary, shared.dir, shared.err = nil, "", "", nil
}

// StopFor stops member i for the rest of t: t's cleanup starts it again
// (unless t did, with Restart) and waits until every member answers,
// before the cleanups t registered earlier run.
func (c *Cluster) StopFor(t testing.TB, i int) {
	t.Helper()
	c.Stop(i)
	t.Cleanup(func() {
		if !c.Running(i) {
			c.Restart(t, i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c.WaitHealthy(ctx, t)
	})
}
