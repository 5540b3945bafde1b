package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/peer"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// cli runs the runrecordd binary under test with args and returns its
// output, failing t when it fails.
func cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(daemonBinary, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("runrecordd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// A host in a fleet, on a real 3-member etcd cluster: its key admitted by
// the operator (`fleet key`, `fleet admit`), it serves with --etcd, and the
// fleet's directory follows the run's record through a real park and
// resume of the oracle; `fleet status` counts the run as the host's. A
// host whose key nobody admitted does not start.
func TestFleetHost(t *testing.T) {
	privileged(t)
	c := etcdtest.Start(t)
	endpoints := strings.Join(c.Endpoints(), ",")

	stranger, err := newDaemon("stranger", func(d *daemon) { d.flags = []string{"--etcd", endpoints} })
	if stranger != nil && !stranger.running() {
		// Refused before it started containerd: only its directory is left.
		if err := stranger.noneLeft(); err != nil {
			t.Error(err)
		}
		os.RemoveAll(stranger.root)
	}
	if err == nil || !strings.Contains(err.Error(), "admit this host first") {
		if stranger != nil && stranger.running() {
			_ = stranger.shutdown(true)
		}
		t.Fatalf("a host nobody admitted: %v, want a refusal naming `fleet admit`", err)
	}

	peerAddr := freeAddr(t)
	var hostKey string
	d := mustDaemon(t, "fleet", func(d *daemon) {
		hostKey = cli(t, "fleet", "key", "--state-dir", d.state)
		cli(t, "fleet", "admit", hostKey, "--name", "h1", "--etcd", endpoints)
		d.flags = []string{"--etcd", endpoints, "--lease-ttl", "5s", "--peer-listen", peerAddr}
	})
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "owned"
	started := startOracle(t, d, id, oracleImage)
	genesis, err := record.ParseAddress(started.Head)
	if err != nil {
		t.Fatal(err)
	}
	dir := fleet.New(c.Client(t), "", 5*time.Second)
	follows := func(step string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := d.run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		e, err := dir.Run(ctx, genesis)
		if err != nil || e.Head.String() != r.Head || e.Phase.String() != r.Phase || e.Run != id {
			t.Fatalf("after %s: directory %+v (%v), record %s at %s", step, e, err, r.Phase, r.Head)
		}
	}
	follows("start")
	_, atPark := park(t, d, id)
	follows("park")
	resume(t, d, id, nil, atPark)
	follows("resume")
	peerRoutes(t, endpoints, peerAddr, hostKey, started.Unit)
	status := cli(t, "fleet", "status", "--etcd", endpoints)
	if !strings.Contains(status, "\th1\thost\tlease ") || !strings.Contains(status, "orphaned runs: 0") {
		t.Fatalf("fleet status:\n%s", status)
	}
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// peerRoutes checks the host's mutual-TLS listener at addr: an admitted
// platform key reaches the client API and not the objects, an admitted
// host key the objects (bytes that hash to the address asked for) and not
// the API, and a key nobody admitted is refused at the handshake.
func peerRoutes(t *testing.T, endpoints, addr, serverKey, object string) {
	t.Helper()
	server, err := record.ParseAddress(serverKey)
	if err != nil {
		t.Fatal(err)
	}
	clientFor := func(role string) *http.Client {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if role != "" {
			id := attest.KeyID(key.Public().(ed25519.PublicKey))
			cli(t, "fleet", "admit", id.String(), "--name", role+"-e2e", "--role", role, "--etcd", endpoints)
		}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: peer.ClientConfig(key, server)}}
	}
	get := func(c *http.Client, path string) (int, []byte) {
		t.Helper()
		resp, err := c.Get("https://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	platform, host := clientFor("platform"), clientFor("host")
	if code, b := get(platform, "/v1/host"); code != http.StatusOK || !strings.Contains(string(b), serverKey) {
		t.Fatalf("a platform key on the API: %d %s", code, b)
	}
	if code, b := get(platform, "/v1/objects/"+object); code != http.StatusForbidden || !strings.Contains(string(b), api.CodeForbidden) {
		t.Fatalf("a platform key on the objects: %d %s", code, b)
	}
	code, b := get(host, "/v1/objects/"+object)
	if code != http.StatusOK || record.Sum(b).String() != object {
		t.Fatalf("a host key on the objects: %d, %d bytes", code, len(b))
	}
	if code, b := get(host, "/v1/host"); code != http.StatusForbidden {
		t.Fatalf("a host key on the API: %d %s", code, b)
	}
	if _, err := clientFor("").Get("https://" + addr + "/v1/host"); err == nil {
		t.Fatal("a key nobody admitted got through the handshake")
	}
}
