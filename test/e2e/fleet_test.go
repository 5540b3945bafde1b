package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// cli runs the runrecordd binary under test with args and returns its
// output, failing t when it fails.
func cli(t *testing.T, args ...string) string {
	t.Helper()
	return cliOf(t, daemonBinary, args...)
}

// cliOf is cli with the runrecordd binary bin.
func cliOf(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
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
	f := fleetCluster(t)

	stranger, err := newDaemon("stranger", func(d *daemon) { d.flags = f.flags() })
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
		f.cli(t, "fleet", "admit", hostKey, "--name", "h1")
		d.flags = append(f.flags(), "--lease-ttl", "5s", "--peer-listen", peerAddr)
	})
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	const id = "owned"
	started := startOracle(t, d, id, oracleImage)
	genesis, err := record.ParseAddress(started.Head)
	if err != nil {
		t.Fatal(err)
	}
	dir := f.dir(t)
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
	peerRoutes(t, f, peerAddr, hostKey, started.Unit)
	status := f.cli(t, "fleet", "status")
	if !regexp.MustCompile(`(?m)^`+hostKey+` +h1 +host +lease [0-9a-f]+ +1 +-$`).MatchString(status) || !strings.Contains(status, "orphaned runs: 0") {
		t.Fatalf("fleet status:\n%s", status)
	}
	// -o json: one object, the members and the orphans (docs/cli.md).
	type member struct {
		Key, Name, Role, Lease, Peer string
		Runs                         int
		Draining                     bool
	}
	var js struct {
		Members []member
		Orphans []json.RawMessage
	}
	if err := json.Unmarshal([]byte(f.cli(t, "fleet", "status", "-o", "json")), &js); err != nil {
		t.Fatal(err)
	}
	// peerRoutes admitted a host and a platform key besides h1.
	if len(js.Members) != 3 || js.Orphans == nil || len(js.Orphans) != 0 {
		t.Fatalf("fleet status -o json: %+v", js)
	}
	i := slices.IndexFunc(js.Members, func(m member) bool { return m.Key == hostKey })
	if i < 0 {
		t.Fatalf("fleet status -o json: no member %s: %+v", hostKey, js)
	}
	if m := js.Members[i]; m.Name != "h1" || m.Role != "host" || m.Lease == "" || m.Peer != peerAddr || m.Runs != 1 || m.Draining {
		t.Fatalf("fleet status -o json: member %+v", m)
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
// host key neither the API nor, with no transfer to it pending, the
// objects (docs/fleet.md, "Peer routes"), and a key nobody admitted is
// refused at the handshake.
func peerRoutes(t *testing.T, f *fleetEnv, addr, serverKey, object string) {
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
			f.cli(t, "fleet", "admit", id.String(), "--name", role+"-e2e", "--role", role)
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
	if code, b := get(platform, "/v1/runs"); code != http.StatusOK || strings.TrimSpace(string(b)) != "[]" {
		t.Fatalf("a platform key on the API: %d %s (it started no run: it sees none)", code, b)
	}
	if code, b := get(platform, "/v1/objects/"+object); code != http.StatusForbidden || !strings.Contains(string(b), api.CodeForbidden) {
		t.Fatalf("a platform key on the objects: %d %s", code, b)
	}
	if code, b := get(host, "/v1/objects/"+object); code != http.StatusForbidden || !strings.Contains(string(b), api.CodeForbidden) {
		t.Fatalf("a host key with no transfer pending on the objects: %d, %d bytes", code, len(b))
	}
	if code, b := get(host, "/v1/runs"); code != http.StatusForbidden {
		t.Fatalf("a host key on the API: %d %s", code, b)
	}
	if _, err := clientFor("").Get("https://" + addr + "/v1/runs"); err == nil {
		t.Fatal("a key nobody admitted got through the handshake")
	}
}

// `migrate` moves a running oracle from one host of a real fleet to
// another over their mutual-TLS listeners: parked on the first, handed off
// there and in etcd, fetched, judged and claimed on the second, and
// resumed there as the same process; the record verifies on the second,
// whose key the directory names as the owner, and the first holds it
// handed off. A second migration of it from the first host is refused.
// Before all that, a migration to a host without the oracle's image is
// refused (manifest_mismatch: it would not resume there) before anything
// changes: the unit goes on running on the first host.
func TestFleetMigrate(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, _ := f.host(t, "fleet-a")
	b, keyB := f.host(t, "fleet-b")
	_, keyC := f.hostWithout(t, "fleet-c")
	const id = "mover"
	started := startOracle(t, a, id, oracleImage)
	// To a host without the oracle's image: it would not resume there, so
	// the migration is refused (manifest_mismatch) before anything
	// changes — the unit still running here, nothing appended.
	_, err := a.c.Migrate(ctx, id, keyC)
	apiError(t, err, "manifest_mismatch")
	if ra, err := a.run(ctx, id); err != nil || ra.HandedOff || ra.Status != "running" || ra.Segments != 0 {
		t.Fatalf("after a migration refused for the target's manifest, the first host holds %+v, %v", ra, err)
	}
	out, err := exec.Command(daemonBinary, "migrate", id, "--to", keyB, "--socket", a.socket).CombinedOutput()
	if err != nil {
		t.Fatalf("migrate: %v\n%s\n%s", err, out, a.logTail())
	}
	onA := output(t, a.stdout(id))
	atPark := last(onA)
	ls := waitLines(t, b.stdout(id), "a line verified on the second host", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > atPark.Counter
	})
	checkOneProcess(t, append(append([]line(nil), onA...), ls...))
	r, err := b.run(ctx, id)
	if err != nil || r.Phase != "executing" || r.Status != "running" || r.Segments != 3 {
		t.Fatalf("on the second host: %+v, %v", r, err)
	}
	if v, err := b.c.Verify(ctx, id); err != nil || !v.OK {
		t.Fatalf("verify on the second host: %+v, %v", v, err)
	}
	if ra, err := a.run(ctx, id); err != nil || !ra.HandedOff || ra.Phase != "parked" {
		t.Fatalf("on the first host: %+v, %v", ra, err)
	}
	genesis, err := record.ParseAddress(started.Head)
	if err != nil {
		t.Fatal(err)
	}
	e, err := f.dir(t).Run(ctx, genesis)
	if err != nil || e.Owner.String() != keyB || e.Head.String() != r.Head || e.Phase != record.PhaseExecuting {
		t.Fatalf("directory %+v (%v), want owned by %s at %s", e, err, keyB, r.Head)
	}
	// Migrated again from the host that handed it off: refused, and the
	// refusal leaves that host's handoff as it was.
	_, err = a.c.Migrate(ctx, id, keyB)
	apiError(t, err, "not_owner")
	if ra, err := a.run(ctx, id); err != nil || !ra.HandedOff {
		t.Fatalf("after a refused migration, the first host holds %+v, %v", ra, err)
	}
}

// A transcript run migrates too, with no image: parked on its await on the
// first host, it arrives parked on the second, and finishes there on the
// results posted there; its record verifies there, NonBlocking.
func TestFleetMigrateTranscript(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, _ := f.host(t, "fleet-ta")
	b, keyB := f.host(t, "fleet-tb")
	for _, d := range []*daemon{a, b} {
		mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	}
	const id = "tr-mover"
	trStart(t, a, id, trAgentImage, "STEPS=2")
	trParked(t, a, id, 2)
	if _, err := a.c.Migrate(ctx, id, keyB); err != nil {
		t.Fatalf("migrate: %v\n%s", err, a.logTail())
	}
	trParked(t, b, id, 2)
	trPost(t, b, id, "call-1", trResult(1))
	trParked(t, b, id, 5)
	trPost(t, b, id, "call-2", trResult(2))
	trClosed(t, b, id)
	v, err := b.c.Verify(ctx, id)
	if err != nil || !v.OK || v.Phase != "closed" || v.WaitProof.Verdict != "NonBlocking" {
		t.Fatalf("verify on the second host: %+v, %v", v, err)
	}
	if ra, err := a.run(ctx, id); err != nil || !ra.HandedOff {
		t.Fatalf("on the first host: %+v, %v", ra, err)
	}
}

// The fork the fleet exists to prevent: a run two hosts both hold parked,
// and not handed off (one imported the other's bundle, then the other took
// the very bundle back with --reclaim, as an operator may by mistake).
// Both resume it at once: exactly one succeeds — the owner in etcd — and
// the other is refused with not_owner, leaving its copy parked.
func TestFleetConcurrentResume(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, _ := f.host(t, "fleet-ca")
	b, _ := f.host(t, "fleet-cb")
	const id = "forked"
	startOracle(t, a, id, oracleImage)
	park(t, a, id)
	var bundle bytes.Buffer
	if err := a.c.Export(ctx, id, &bundle); err != nil {
		t.Fatal(err)
	}
	trustHost(t, a, b)
	if _, err := b.c.Import(ctx, bytes.NewReader(bundle.Bytes()), ""); err != nil {
		t.Fatalf("import on the second host: %v", err)
	}
	if _, err := a.c.ImportWith(ctx, bytes.NewReader(bundle.Bytes()), "", true); err != nil {
		t.Fatalf("reclaim on the first host: %v", err)
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, d := range []*daemon{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = d.c.Resume(ctx, id)
		}()
	}
	wg.Wait()
	if errs[0] != nil {
		t.Fatalf("the owner's resume: %v", errs[0])
	}
	// Refused either way: not_owner when b's resume reaches etcd first;
	// handed_off once b's fleet watcher has seen a's claim (its import's
	// own claim was refused) and marked its copy another host's — which
	// one comes first is the scheduler's (under load, the watcher).
	var ae *api.Error
	if !errors.As(errs[1], &ae) || (ae.Code != "not_owner" && ae.Code != "handed_off") {
		t.Fatalf("the second resume: %v (%T), want not_owner or handed_off", errs[1], errs[1])
	}
	if r, err := b.run(ctx, id); err != nil || r.Phase != "parked" || r.Segments != 2 {
		t.Fatalf("the refused host holds %+v, %v", r, err)
	}
}

// holder is which of hosts holds run id not handed off, and its summary.
func holder(t *testing.T, id string, hosts ...*daemon) (*daemon, api.Run) {
	t.Helper()
	for _, d := range hosts {
		if r, err := d.run(context.Background(), id); err == nil && !r.HandedOff {
			return d, r
		}
	}
	t.Fatalf("no host holds %s", id)
	return nil, api.Run{}
}

// `drain` moves every run off a host of a real 3-host fleet: a running
// oracle and two transcript runs parked on their awaits, transcript runs
// first. Each ends up on one of the other two hosts as it was — the oracle
// running, as the same process; the transcript runs parked, then finishing
// there on the results posted there — owned there in etcd, handed off on
// the drained host, none on two hosts. The drained host refuses new runs.
// Placement: the host with the most room lacks the oracle's image, so the
// oracle goes to the other, and the one without is never asked to take it
// (with the manifest left unjudged, it went there, claimed it and could not
// resume it).
func TestFleetDrain(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, _ := f.host(t, "drain-a")
	b, keyB := f.host(t, "drain-b")
	// drain-c has the most room (it keeps 1 byte free, b 1 GiB) but not
	// the oracle's image: placement sends the oracle to b, and c is never
	// asked to take it.
	cc, keyC := f.hostWithout(t, "drain-c", "--min-free", "1")
	for _, d := range []*daemon{a, b, cc} {
		mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	}
	startOracle(t, a, "d-oracle", oracleImage)
	for _, id := range []string{"d-agent1", "d-agent2"} {
		trStart(t, a, id, trAgentImage, "STEPS=1")
		trParked(t, a, id, 2)
	}
	// One of etcd's three members is down for the drain: the fleet goes on
	// with the other two.
	f.c.StopFor(t, 2)
	// -o json: one object on stdout; each run's outcome, as it ends, a
	// drain.run event's line on stderr.
	var stdout, stderr bytes.Buffer
	drain := exec.Command(daemonBinary, "drain", "--socket", a.socket, "-o", "json")
	drain.Stdout, drain.Stderr = &stdout, &stderr
	err := drain.Run()
	t.Logf("drain:\n%s%s", stdout.Bytes(), stderr.Bytes())
	var drained api.Drain
	if err != nil || json.Unmarshal(stdout.Bytes(), &drained) != nil || drained.Moved != 3 || drained.Left != 0 {
		t.Fatalf("drain: %v, %+v\n%s", err, drained, a.logTail())
	}
	var outcomes []string
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var e api.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Kind != "drain.run" {
			t.Fatalf("drain's stderr line %q: %v", l, err)
		}
		outcomes = append(outcomes, e.Run)
	}
	slices.Sort(outcomes)
	if !slices.Equal(outcomes, []string{"d-agent1", "d-agent2", "d-oracle"}) {
		t.Fatalf("drain's outcomes on stderr: %q", outcomes)
	}
	if _, err := a.c.Start(ctx, api.RunRequest{ID: "late", Unit: unit.Spec{Image: oracleImage}}); err == nil {
		t.Fatal("a drained host took a new run")
	} else {
		apiError(t, err, "draining")
	}
	dir := f.dir(t)
	keys := map[*daemon]string{b: keyB, cc: keyC}
	for _, id := range []string{"d-oracle", "d-agent1", "d-agent2"} {
		if r, err := a.run(ctx, id); err != nil || !r.HandedOff {
			t.Fatalf("%s on the drained host: %+v, %v", id, r, err)
		}
		d, r := holder(t, id, b, cc)
		unitID, err1 := record.ParseAddress(r.Unit)
		grantsID, err2 := record.ParseAddress(r.Grants)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if e, err := dir.Run(ctx, record.Genesis(unitID, grantsID)); err != nil || e.Owner.String() != keys[d] || e.Head.String() != r.Head {
			t.Fatalf("%s on %s at %s: directory %+v, %v", id, d.name, r.Head, e, err)
		}
		if v, err := d.c.Verify(ctx, id); err != nil || !v.OK {
			t.Fatalf("%s on %s: verify %+v, %v", id, d.name, v, err)
		}
		t.Logf("%s: on %s (%s)", id, d.name, keys[d])
	}
	// The oracle went where its manifest fits, and nowhere else.
	d, _ := holder(t, "d-oracle", b, cc)
	if d != b {
		t.Fatalf("the oracle went to %s, which lacks its image", d.name)
	}
	if _, err := cc.run(ctx, "d-oracle"); err == nil {
		t.Fatal("drain-c, which lacks the oracle's image, stored it")
	}
	// The oracle goes on as the same process where it went.
	onA := output(t, a.stdout("d-oracle"))
	ls := waitLines(t, d.stdout("d-oracle"), "the oracle verified after the drain", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > last(onA).Counter
	})
	checkOneProcess(t, append(append([]line(nil), onA...), ls...))
	// The transcript runs finish where they went.
	for _, id := range []string{"d-agent1", "d-agent2"} {
		d, _ := holder(t, id, b, cc)
		trParked(t, d, id, 2)
		trPost(t, d, id, "call-1", trResult(1))
		trClosed(t, d, id)
	}
}

// A lost host: the first host is killed (SIGKILL) with a run parked that
// the second holds as a copy. Once its lease expires the run is listed
// orphaned, and `adopt` on the second host makes it that host's — its
// record as it was — where it resumes as the same process. Adopting a run
// whose owner is alive is refused, and the first host, back, may not
// resume what it no longer owns: its start holds it handed off.
func TestFleetAdopt(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, _ := f.hostAt(t, "lost-a", "5s")
	b, keyB := f.host(t, "lost-b")
	const id = "orphan"
	startOracle(t, a, id, oracleImage)
	_, atPark := park(t, a, id)
	onA := output(t, a.stdout(id))
	var bundle bytes.Buffer
	if err := a.c.ExportCopy(ctx, id, &bundle); err != nil {
		t.Fatal(err)
	}
	trustHost(t, a, b)
	if _, err := b.c.Import(ctx, bytes.NewReader(bundle.Bytes()), ""); err != nil {
		t.Fatal(err)
	}
	_, err := b.c.Adopt(ctx, id)
	apiError(t, err, "not_owner")

	loseHost(t, f, a)
	r, err := b.c.Adopt(ctx, id)
	if err != nil || r.Phase != "parked" || r.HandedOff || r.Segments != 2 {
		t.Fatalf("adopt: %+v, %v", r, err)
	}
	resume(t, b, id, onA, atPark)
	owned, err := f.dir(t).Owned(ctx, record.Address{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range owned {
		t.Fatalf("an entry owned by nobody: %+v", e)
	}
	if r, err := b.run(ctx, id); err != nil {
		t.Fatal(err)
	} else if g := genesisOf(t, r); g != (record.Address{}) {
		if e, err := f.dir(t).Run(ctx, g); err != nil || e.Owner.String() != keyB || e.Head.String() != r.Head {
			t.Fatalf("directory %+v (%v), want owned by the adopter at %s", e, err, r.Head)
		}
	}
	// Back, the lost host learns at its start that the run is elsewhere
	// (fleet.Reconcile): it holds it handed off.
	mustStart(t, a)
	_, err = a.c.Resume(ctx, id)
	apiError(t, err, "handed_off")
}

// genesisOf is a run's genesis, from its unit and grant set ids.
func genesisOf(t *testing.T, r api.Run) record.Address {
	t.Helper()
	u, err1 := record.ParseAddress(r.Unit)
	g, err2 := record.ParseAddress(r.Grants)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	return record.Genesis(u, g)
}

// A migration cut by a kill -9 of the source or of the target at each of
// its steps leaves the run whole and on one host: the killed host may not
// start again while its old session's lease lives; once that lease is
// gone (ended by the test as etcd would at its expiry: TestFleetAdopt
// waits a real expiry out) and the host restarted, exactly one host owns
// the run in etcd and resumes it — the oracle going on as the same
// process — while the other refuses to; its record verifies there. A
// target killed before its claim leaves the run to the source, which
// resumed it when the migration failed.
func TestFleetMigrateCrash(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	// Leases of 60 s: a killed host's outlives its restart's first try
	// (restartKilled).
	a, keyA := f.hostAt(t, "crash-a", "60s")
	b, keyB := f.hostAt(t, "crash-b", "60s")
	dir := f.dir(t)
	keys := map[*daemon]string{a: keyA, b: keyB}
	cases := []struct {
		step   string
		victim *daemon
		owner  *daemon // where the run ends
		back   bool    // the source, alive, resumed it when the migration failed
	}{
		{"migrate.transferred", a, a, false},
		{"migrate.handedoff", a, a, false},
		{"receive.fetched", b, a, true},
		{"receive.imported", b, a, true},
		{"receive.claimed", b, b, false},
	}
	if len(cases) != len(failpoint.MigrationSteps) {
		t.Fatalf("%d cases for the %d migration failpoints", len(cases), len(failpoint.MigrationSteps))
	}
	for i, step := range failpoint.MigrationSteps {
		if cases[i].step != step {
			t.Fatalf("failpoint %s: the test does not know where it leaves the run", step)
		}
	}
	for i, tc := range cases {
		t.Run(tc.step, func(t *testing.T) {
			id := fmt.Sprintf("crash-%d", i)
			started := startOracle(t, a, id, oracleImage)
			mustStop(t, tc.victim)
			tc.victim.env = []string{failpoint.Env + "=" + tc.step}
			mustStart(t, tc.victim)
			out, err := exec.Command(daemonBinary, "migrate", id, "--to", keyB, "--socket", a.socket).CombinedOutput()
			t.Logf("migrate (%v): %s", err, out)
			crashKilled(t, tc.victim, tc.step)
			tc.victim.env = nil
			f.restartKilled(t, tc.victim, keys[tc.victim])

			onA := output(t, a.stdout(id))
			atPark := last(onA)
			other, ownerKey, prior := b, keyA, []line(nil)
			if tc.owner == b {
				other, ownerKey, prior = a, keyB, onA
			}
			if e, err := dir.Run(ctx, genesisOf(t, started)); err != nil || e.Owner.String() != ownerKey || !e.To.IsZero() {
				t.Fatalf("directory %+v, %v; want owned by %s", e, err, tc.owner.name)
			}
			if _, err := other.c.Resume(ctx, id); err == nil {
				t.Fatalf("the %s daemon resumed a run it does not own", other.name)
			}
			if tc.back {
				if !strings.Contains(string(out), "the unit runs here again") {
					t.Fatalf("migrate: %s; want the unit running on the source again", out)
				}
				n := len(onA)
				ls := waitLines(t, a.stdout(id), "the oracle going on on the source", func(ls []line) bool { return len(ls) > n+1 })
				checkOneProcess(t, ls)
			} else {
				resume(t, tc.owner, id, prior, atPark)
			}
			if v, err := tc.owner.c.Verify(ctx, id); err != nil || !v.OK {
				t.Fatalf("verify on the %s daemon: %+v, %v", tc.owner.name, v, err)
			}
		})
	}
}

// A host that cannot reach etcd cannot confirm it owns its runs, and does
// nothing it would need that for: its park of a running oracle is refused
// (unavailable), nothing is appended, and the oracle goes on running there.
// Safety over liveness: the other hosts of the fleet are not affected. Once
// etcd answers again the host acts again: it closes the run.
func TestFleetEtcdUnreachable(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	// This host reaches the fleet through one member only, and its lease
	// outlives the outage: its session goes on once etcd answers again.
	// It gives each etcd request 1 s (--etcd-timeout), not 5.
	cut, _ := f.start(t, "cut-off", append(f.flags(f.c.Endpoint(0)), "--lease-ttl", "60s", "--etcd-timeout", "1s"))
	mustImportImage(t, cut, oracleArchive, oracleImage, oracleDigest)
	const id = "stranded"
	startOracle(t, cut, id, oracleImage)
	before, err := cut.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	f.c.StopFor(t, 0)
	_, err = cut.c.Park(ctx, id)
	var ae *api.Error
	if !errors.As(err, &ae) || (ae.Code != api.CodeUnavailable && ae.Code != api.CodeNotOwner) {
		t.Fatalf("park with etcd out of reach: %v, want unavailable (or not_owner once the lease is gone)", err)
	}
	after, err := cut.run(ctx, id)
	if err != nil || after.Segments != before.Segments || after.Head != before.Head || after.Status != "running" {
		t.Fatalf("after the refused park: %+v, %v; before %+v", after, err, before)
	}
	n := len(output(t, cut.stdout(id)))
	waitLines(t, cut.stdout(id), "the oracle going on after the refused park", func(ls []line) bool { return len(ls) > n+1 })
	// The etcd client's own warnings are in the daemon's log (zapToSlog).
	for deadline := time.Now().Add(30 * time.Second); !logHas(cut, "from=etcd-client"); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no line from the etcd client in the daemon's log while etcd is out of reach:\n%s", cut.logTail())
		}
	}

	// etcd back, the host's session goes on: the run closes there once
	// the host's client has reached its member again (its reconnects back
	// off, so a close right after the restart may still be refused).
	f.c.Restart(t, 0)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	f.c.WaitHealthy(wctx, t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := cut.c.Close(ctx, id, "e2e: etcd is back")
		if err == nil {
			break
		}
		if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || time.Now().After(deadline) {
			t.Fatalf("close with etcd back: %v", err)
		}
	}
}

// TestFleetComeBackOnlyOwned: a host resumes at its start only the runs
// its last `park --all` (or stop) parked that the directory still says
// it owns. Host A parks its run with park --all and is killed; while it
// is down, B adopts the run from a copy; A, started again, leaves the run
// to B (handed off here, not resumed), and B resumes it from that park.
func TestFleetComeBackOnlyOwned(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, _ := f.hostAt(t, "back-a", "5s")
	b, _ := f.host(t, "back-b")
	const id = "back-owned"
	startOracle(t, a, id, oracleImage)
	p, err := a.c.ParkAll(ctx, api.ParkAllRequest{Parallel: 1})
	if err != nil || p.Parked != 1 {
		t.Fatalf("park --all: %+v, %v", p, err)
	}
	onA := output(t, a.stdout(id))
	atPark := last(onA)
	var bundle bytes.Buffer
	if err := a.c.ExportCopy(ctx, id, &bundle); err != nil {
		t.Fatal(err)
	}
	trustHost(t, a, b)
	if _, err := b.c.Import(ctx, bytes.NewReader(bundle.Bytes()), ""); err != nil {
		t.Fatal(err)
	}
	loseHost(t, f, a)
	if r, err := b.c.Adopt(ctx, id); err != nil || r.Phase != "parked" {
		t.Fatalf("adopt: %+v, %v", r, err)
	}
	bHead, err := b.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	// The start's resumes are done at READY=1.
	notify, got := notifySocket(t)
	a.env = []string{"NOTIFY_SOCKET=" + notify}
	mustStart(t, a)
	await(t, got, a.cmd.Process.Pid, "READY=1", 2*time.Minute)
	if r, err := a.run(ctx, id); err != nil || r.Phase == "executing" {
		t.Fatalf("on the restarted host: %+v, %v; want the run left to its owner", r, err)
	}
	if _, err := a.c.Resume(ctx, id); err == nil {
		t.Fatal("the restarted host resumed a run another host owns")
	}
	if r, err := b.run(ctx, id); err != nil || r.Head != bHead.Head || r.Phase != "parked" {
		t.Fatalf("the owner's run after the other's start: %+v, %v; want it as adopted", r, err)
	}
	resume(t, b, id, onA, atPark)
}

// logHas says whether d's log holds s.
func logHas(d *daemon, s string) bool {
	b, _ := os.ReadFile(d.log)
	return strings.Contains(string(b), s)
}

// loseHost kills host a with SIGKILL and waits until the fleet lists its
// one run orphaned (its lease expired).
func loseHost(t *testing.T, f *fleetEnv, a *daemon) {
	t.Helper()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.done
	a.cmd = nil
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(f.cli(t, "fleet", "status"), "orphaned runs: 1") {
		if time.Now().After(deadline) {
			t.Fatal("the lost host's run was never listed orphaned")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
