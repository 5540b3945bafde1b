// Package etcdtest starts a real etcd cluster inside a test process, for
// the tests of anything coordinated by etcd (internal/fleet, and later the
// daemon's fleet wiring and its end-to-end tests).
//
// [Start] runs three members with go.etcd.io/etcd/server/v3/embed, on
// 127.0.0.1 with ports free at the start, each in a directory of
// t.TempDir(). One member can be stopped ([Cluster.Stop]) and started again
// on its own data ([Cluster.Restart]); the cluster keeps quorum with two.
// [Cluster.Close] stops every member and waits until none serves any more;
// it is also registered with t.Cleanup, so a test leaves nothing running.
//
// [Shared] hands one cluster to every test of a process that asks, each
// under a key prefix of its own: starting and closing a cluster costs 3-4
// seconds, a test on a settled one nothing. The package's TestMain closes
// it ([CloseShared]); a test that stops a member restarts it in its
// cleanup ([Cluster.StopFor]).
//
// # Members in processes
//
// [Spawn] and [SharedSpawned] run each member as a process of the member
// program (./internal/etcdtest/etcdmember, built with [Build]) instead of
// inside the test process. The end-to-end tests do: there the test
// process is built with -race and runs beside other packages' tests on
// few cores, and three members inside it can stall together (a change of
// leader among it) for longer than a daemon's etcd request may take
// (docs/fleet.md, "The test cluster").
// A member process stops when its standard input ends: [Cluster.Stop]
// closes it, and so does the kernel when the test process exits, however
// it exits.
//
// # Caveats
//
//   - Ports are found by listening on port 0 and closing the listener, so
//     another process may take one before etcd binds it. Start retries
//     the whole cluster on a bind failure; a Restart reuses the member's
//     ports (its peer address is part of the cluster's membership) and
//     fails if one was taken in between.
//   - Members run with fsync disabled to keep tests fast; what they prove
//     is the protocol, not durability of this test cluster's disks.
//     Heartbeats and elections keep etcd's defaults (100 ms, 1 s), so the
//     shortest lease is 2 s.
//   - The members log nothing (a no-op zap logger); an error is returned
//     instead.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Members is the size of a cluster [Start] makes.
const Members = 3

// startTimeout bounds how long a member may take to join its cluster and
// become ready to serve.
const startTimeout = 30 * time.Second

// Cluster is a running test cluster.
type Cluster struct {
	token   string
	binary  string  // the member program; "" runs members in this process
	secure  *Secure // client TLS and authentication; nil: neither
	members []*member
	mu      sync.Mutex // guards every member's run
}

type member struct {
	name    string
	dir     string
	tls     string // the directory of a Secure's files: clients over TLS
	peerURL url.URL
	client  url.URL
	initial string
	run     instance // nil while stopped
}

// instance is a running member: an embedded server of this process, or a
// process of the member program ([Spawn]).
type instance interface {
	// leads reports whether the member is the cluster's leader, as far as
	// it can tell at once.
	leads() bool
	// close stops the member and waits until it no longer serves.
	close()
}

// Start runs a cluster of [Members] members and waits until it has a
// leader and every member serves. It fails t if the cluster does not start.
func Start(t testing.TB) *Cluster {
	t.Helper()
	c, err := Run(t.TempDir)
	if err != nil {
		t.Fatalf("etcdtest: start a %d-member cluster: %v", Members, err)
	}
	t.Cleanup(c.Close)
	return c
}

// Run is Start outside a test (deploy/fleet-demo.sh's cluster): each
// member's data goes in a directory dir makes; the caller closes the
// cluster.
func Run(dir func() string) (*Cluster, error) { return Spawn("", dir) }

// Spawn is Run with each member a process of binary, the member program
// ([Build], [Serve]); with binary "" it is Run. A member process shares
// nothing with the caller's: not its scheduler, its garbage collector nor
// its race detector, so a busy test process does not stall the cluster
// (see "Members in processes" in the package doc).
func Spawn(binary string, dir func() string) (*Cluster, error) { return spawnWith(binary, dir, nil) }

// spawnWith is Spawn, with client TLS when s is not nil.
func spawnWith(binary string, dir func() string, s *Secure) (*Cluster, error) {
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := start(binary, dir, attempt, s)
		if err == nil {
			return c, nil
		}
		last = err
		if !isAddrInUse(err) {
			break
		}
	}
	return nil, last
}

func start(binary string, tempDir func() string, attempt int, s *Secure) (*Cluster, error) {
	ports, err := freePorts(2 * Members)
	if err != nil {
		return nil, err
	}
	c := &Cluster{token: fmt.Sprintf("etcdtest-%d-%d", time.Now().UnixNano(), attempt), binary: binary, secure: s}
	scheme, tlsDir := "http", ""
	if s != nil {
		scheme, tlsDir = "https", s.Dir
	}
	var initial []string
	for i := 0; i < Members; i++ {
		m := &member{
			name:    fmt.Sprintf("m%d", i),
			dir:     tempDir(),
			tls:     tlsDir,
			peerURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])},
			client:  url.URL{Scheme: scheme, Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])},
		}
		initial = append(initial, m.name+"="+m.peerURL.String())
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.initial = strings.Join(initial, ",")
	}
	// Members of a new cluster wait for each other, so start them together.
	errs := make([]error, Members)
	var wg sync.WaitGroup
	for i, m := range c.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.run(m)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// run starts m on its data directory and waits until it serves.
func (c *Cluster) run(m *member) error {
	var (
		r   instance
		err error
	)
	if c.binary == "" {
		var e *embed.Etcd
		e, err = serve(m, c.token)
		r = embedded{e}
	} else {
		r, err = spawn(c.binary, m, c.token)
	}
	if err != nil {
		return fmt.Errorf("member %s: %w", m.name, err)
	}
	c.mu.Lock()
	m.run = r
	c.mu.Unlock()
	return nil
}

// serve starts m as an embedded server of this process, in cluster token,
// and waits until it serves.
func serve(m *member, token string) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.ListenClientUrls = []url.URL{m.client}
	cfg.AdvertiseClientUrls = []url.URL{m.client}
	cfg.InitialCluster = m.initial
	cfg.InitialClusterToken = token
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.TickMs = 100      // etcd's default
	cfg.ElectionMs = 1000 // etcd's default: shorter ones elected anew under a loaded test machine
	cfg.UnsafeNoFsync = true
	cfg.EnableGRPCGateway = false
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if m.tls != "" {
		cfg.ClientTLSInfo = (&Secure{Dir: m.tls}).serverTLS()
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-time.After(startTimeout):
		e.Close()
		return nil, fmt.Errorf("not ready after %s", startTimeout)
	}
}

// embedded is a member served by this process.
type embedded struct{ e *embed.Etcd }

func (r embedded) leads() bool {
	s := r.e.Server
	return s.Lead() == uint64(s.MemberID())
}

func (r embedded) close() { r.e.Close() }

// Endpoints returns every member's client URL, stopped members included.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.client.String()
	}
	return out
}

// Endpoint returns member i's client URL.
func (c *Cluster) Endpoint(i int) string { return c.members[i].client.String() }

// Client returns a client of every member, closed when t ends: as root,
// over TLS, on a cluster with both.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	if c.secure == nil {
		return NewClient(t, c.Endpoints()...)
	}
	cli, err := c.rootClient()
	if err != nil {
		t.Fatalf("etcdtest: root client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// NewClient returns a client of endpoints with a short dial timeout,
// closed when t ends. Endpoints need not be up.
func NewClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client of %v: %v", endpoints, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Stop stops member i and waits until it no longer serves. The others keep
// quorum while at most one of three is stopped.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	r := c.members[i].run
	c.members[i].run = nil
	c.mu.Unlock()
	if r != nil {
		r.close()
	}
}

// Restart starts a stopped member i again on its data and ports and waits
// until it serves.
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	if c.Running(i) {
		t.Fatalf("etcdtest: member %d is running", i)
	}
	if err := c.run(c.members[i]); err != nil {
		t.Fatalf("etcdtest: restart: %v", err)
	}
}

// Running reports whether member i serves.
func (c *Cluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].run != nil
}

// Close stops every member. Calling it again does nothing.
//
// Followers stop first, together, then the leader: a leader stopping
// hands its leadership to a peer, and with its peers stopping at the same
// moment it would wait for the request timeout (6 s here) instead.
func (c *Cluster) Close() {
	var leaders, followers []int
	c.mu.Lock()
	runs := make([]instance, len(c.members))
	for i, m := range c.members {
		runs[i] = m.run
	}
	c.mu.Unlock()
	for i, r := range runs {
		switch {
		case r == nil:
		case r.leads():
			leaders = append(leaders, i)
		default:
			followers = append(followers, i)
		}
	}
	for _, group := range [][]int{followers, leaders} {
		var wg sync.WaitGroup
		for _, i := range group {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Stop(i)
			}()
		}
		wg.Wait()
	}
}

// WaitHealthy waits until every running member answers a linearizable
// read, so a test that stopped or restarted one starts from a settled
// cluster.
func (c *Cluster) WaitHealthy(ctx context.Context, t testing.TB) {
	t.Helper()
	for i, m := range c.members {
		if !c.Running(i) {
			continue
		}
		cli := NewClient(t, m.client.String())
		if c.secure != nil {
			cfg, err := c.secure.ClientConfig([]string{m.client.String()}, "root", c.secure.RootPassword)
			if err == nil {
				_ = cli.Close()
				cli, err = clientv3.New(cfg)
			}
			if err != nil {
				t.Fatalf("etcdtest: member %d: %v", i, err)
			}
		}
		for {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := cli.Get(rctx, "etcdtest-health")
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("etcdtest: member %d not healthy: %v", i, err)
			}
		}
		_ = cli.Close()
	}
}

// freePorts returns n distinct ports on 127.0.0.1 that were free a moment
// ago: all n listeners are open at once, so none repeats.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func isAddrInUse(err error) bool {
	return err != nil && strings.Contains(err.Error(), "address already in use")
}
