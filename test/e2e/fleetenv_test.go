//go:build linux

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The fleet tests share one 3-member etcd cluster (etcdtest.SharedSpawned),
// started by the first of them and closed by TestMain: starting and
// closing a cluster costs 3-4 s, which each test paid before. Its members
// run as processes of their own (etcdMember), not in this -race test
// process, where they stalled for seconds under load. Each test
// has a key prefix of its own (--etcd-prefix /e2e/TestName/), so no test
// sees another's hosts, runs or orphans. A test that stops a member
// restarts it in its cleanup (etcdtest.Cluster.StopFor), and every test
// starts from all three members running and answering.

// fleetEnv is t's view of the shared cluster: every endpoint, and t's
// prefix.
type fleetEnv struct {
	c         *etcdtest.Cluster
	endpoints string // every member's client URL, comma-separated
	prefix    string
	etcd      []string // more flags reaching etcd (TLS, authentication)
}

// fleetCluster returns the shared cluster, settled, with a prefix of t's
// own. It makes t a parallel test, run one fleet test at a time
// (parallelFleet, parallel_test.go): call it before anything else.
func fleetCluster(t *testing.T) *fleetEnv {
	t.Helper()
	parallelFleet(t)
	c := etcdtest.SharedSpawned(t, etcdMember)
	return &fleetEnv{c: c, endpoints: strings.Join(c.Endpoints(), ","), prefix: "/e2e/" + t.Name() + "/"}
}

// dir is the fleet's directory under t's prefix.
func (f *fleetEnv) dir(t *testing.T) *fleet.Dir {
	t.Helper()
	return fleet.New(f.c.Client(t), f.prefix, 5*time.Second)
}

// flags are the flags reaching t's fleet, for `serve` and the fleet
// commands: endpoints, or every member's when none are given.
func (f *fleetEnv) flags(endpoints ...string) []string {
	e := f.endpoints
	if len(endpoints) > 0 {
		e = strings.Join(endpoints, ",")
	}
	return append([]string{"--etcd", e, "--etcd-prefix", f.prefix}, f.etcd...)
}

// cli runs a fleet command (`fleet admit`, `fleet status`) against t's
// fleet.
func (f *fleetEnv) cli(t *testing.T, args ...string) string {
	t.Helper()
	return cli(t, append(args, f.flags()...)...)
}

// host starts a daemon in t's fleet, its key admitted as name, serving the
// fleet on a loopback address; it returns the daemon and its key id.
// Its lease lives 10 s (fleet.DefaultTTL).
func (f *fleetEnv) host(t *testing.T, name string) (*daemon, string) {
	t.Helper()
	return f.hostAt(t, name, "10s")
}

// hostAt is host with the lease's time to live, reaching etcd through
// endpoints (every member when none are given).
func (f *fleetEnv) hostAt(t *testing.T, name, ttl string, endpoints ...string) (*daemon, string) {
	t.Helper()
	d, key := f.start(t, name, append(f.flags(endpoints...), "--lease-ttl", ttl))
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	return d, key
}

// hostWithout is host without the oracle's image (a host an oracle's
// image park does not fit: its manifest records the image's digest),
// served with extra flags.
func (f *fleetEnv) hostWithout(t *testing.T, name string, extra ...string) (*daemon, string) {
	t.Helper()
	return f.start(t, name, append(f.flags(), append([]string{"--lease-ttl", "10s"}, extra...)...))
}

// start starts a daemon in t's fleet with flags, its key admitted as name,
// serving the fleet on a loopback address. opts set the daemon up first
// (its binary: the host makes its key with it).
func (f *fleetEnv) start(t *testing.T, name string, flags []string, opts ...func(*daemon)) (*daemon, string) {
	t.Helper()
	var key string
	d := mustDaemon(t, name, func(d *daemon) {
		for _, o := range opts {
			o(d)
		}
		key = cliOf(t, d.binary(), "fleet", "key", "--state-dir", d.state)
		f.cli(t, "fleet", "admit", key, "--name", name)
		d.flags = append(flags, "--peer-listen", freeAddr(t))
		d.fleet = true
	})
	return d, key
}

// restartKilled starts again a host of the fleet killed (SIGKILL) a moment
// ago. Its old session holds its key until its lease expires, so a start
// now is refused (fleet.ErrHostActive, "already joined"): the test checks
// that, then ends the old lease as etcd does once its time to live is
// out — a revoke — rather than waiting the TTL out, and starts the host.
// The host's lease must outlive the few seconds this takes (the crash
// tests give it 60 s).
func (f *fleetEnv) restartKilled(t *testing.T, d *daemon, key string) {
	t.Helper()
	if err := d.start(); err == nil || !strings.Contains(err.Error(), fleet.ErrHostActive.Error()) {
		t.Fatalf("the %s daemon started again while its killed session's lease lives: %v", d.name, err)
	}
	k, err := record.ParseAddress(key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := f.dir(t).Member(ctx, k)
	if err != nil || m.Lease == 0 {
		t.Fatalf("the killed %s daemon's session: %+v, %v; want its lease still live", d.name, m, err)
	}
	if _, err := f.c.Client(t).Revoke(ctx, clientv3.LeaseID(m.Lease)); err != nil {
		t.Fatal(fmt.Errorf("revoke the killed session's lease %x: %w", m.Lease, err))
	}
	mustStart(t, d)
}
