package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
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

	d := mustDaemon(t, "fleet", func(d *daemon) {
		key := cli(t, "fleet", "key", "--state-dir", d.state)
		cli(t, "fleet", "admit", key, "--name", "h1", "--etcd", endpoints)
		d.flags = []string{"--etcd", endpoints, "--lease-ttl", "5s"}
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
	status := cli(t, "fleet", "status", "--etcd", endpoints)
	if !strings.Contains(status, "\th1\thost\tlease ") || !strings.Contains(status, "orphaned runs: 0") {
		t.Fatalf("fleet status:\n%s", status)
	}
}
