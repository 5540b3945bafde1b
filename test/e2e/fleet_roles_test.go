//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// platformClient is a platform (or host) key's client of one host's peer
// listener.
type platformClient struct {
	t    *testing.T
	c    *http.Client
	base string
	key  string
}

// newKeyClient admits a new key with role in t's fleet (none: not
// admitted) and returns its client of d's peer listener, pinned to d's
// key.
func newKeyClient(t *testing.T, f *fleetEnv, d *daemon, dKey, role string) *platformClient {
	t.Helper()
	server, err := record.ParseAddress(dKey)
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id := attest.KeyID(key.Public().(ed25519.PublicKey)).String()
	if role != "" {
		f.cli(t, "fleet", "admit", id, "--name", role+"-"+id[3:9], "--role", role)
	}
	return &platformClient{t: t, key: id, base: "https://" + peerAddrOf(t, d),
		c: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: peer.ClientConfig(key, server)}}}
}

// peerAddrOf is where d serves the fleet (its --peer-listen).
func peerAddrOf(t *testing.T, d *daemon) string {
	t.Helper()
	i := slices.Index(d.flags, "--peer-listen")
	if i < 0 || i+1 >= len(d.flags) {
		t.Fatalf("the %s daemon serves no peer listener", d.name)
	}
	return d.flags[i+1]
}

// do sends method path with body (JSON when not nil) and returns the
// status and the body; the connection's own failure is an error.
func (p *platformClient) do(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			p.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, p.base+path, rd)
	if err != nil {
		p.t.Fatal(err)
	}
	resp, err := p.c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// want sends the request and fails t unless the answer has status and,
// when code is not empty, that API error code.
func (p *platformClient) want(method, path string, body any, status int, code string) []byte {
	p.t.Helper()
	got, b, err := p.do(method, path, body)
	if err != nil {
		p.t.Fatalf("%s %s: %v", method, path, err)
	}
	var e api.Error
	_ = json.Unmarshal(b, &e)
	if got != status || (code != "" && e.Code != code) {
		p.t.Fatalf("%s %s: %d %s, want %d %s", method, path, got, b, status, code)
	}
	return b
}

// A platform key drives its own runs and nothing else: refused trust, an
// image import, a bundle import with --reclaim, gc, drain and adopt; a run
// mounting a host path (a root-only file) refused before anything runs;
// the runs it starts listed, shown, parked and closed; the operator's runs
// and another platform key's not found, as runs that do not exist; and at
// its quota of runs at once, refused (quota). The operator's socket keeps
// every route.
func TestFleetPlatformRoles(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, keyA := f.start(t, "roles-a", append(f.flags(), "--lease-ttl", "10s", "--platform-runs", "1"))
	mustImportImage(t, a, oracleArchive, oracleImage, oracleDigest)
	p := newKeyClient(t, f, a, keyA, "platform")
	other := newKeyClient(t, f, a, keyA, "platform")

	// Never the host's trust, images, store or runs as a whole.
	p.want("POST", "/v1/trust", map[string]string{"key": p.key, "name": "mine"}, http.StatusForbidden, api.CodeForbidden)
	p.want("GET", "/v1/trust", nil, http.StatusForbidden, api.CodeForbidden)
	p.want("POST", "/v1/images?name=x", nil, http.StatusForbidden, api.CodeForbidden)
	p.want("POST", "/v1/import?reclaim=true", nil, http.StatusForbidden, api.CodeForbidden)
	p.want("POST", "/v1/gc", nil, http.StatusForbidden, api.CodeForbidden)
	p.want("POST", "/v1/drain", map[string]any{}, http.StatusForbidden, api.CodeForbidden)
	p.want("POST", "/v1/runs/x/adopt", nil, http.StatusForbidden, api.CodeForbidden)
	p.want("GET", "/v1/host", nil, http.StatusForbidden, api.CodeForbidden)
	if keys, err := a.c.TrustedKeys(ctx); err != nil || len(keys) != 1 {
		t.Fatalf("the host's trusted keys: %+v, %v; want its own only", keys, err)
	}

	// A host path, however harmless it looks, is not the platform's.
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("root only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	grants := unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork}
	mounted := grants
	mounted.ReadOnly = []unit.Mount{{Source: secret, Target: "/secret"}}
	p.want("POST", "/v1/runs", api.RunRequest{ID: "p-mount", Unit: unit.Spec{Image: oracleImage, Env: oracleEnv}, Grants: mounted},
		http.StatusForbidden, api.CodeGrantRefused)
	if _, err := a.run(ctx, "p-mount"); err == nil {
		t.Fatal("a refused platform run exists")
	}

	// Its own run: started, listed, shown; nobody else's.
	startOracle(t, a, "op-run", oracleImage)
	b := p.want("POST", "/v1/runs", api.RunRequest{ID: "p-run", Unit: unit.Spec{Image: oracleImage, Env: oracleEnv}, Grants: grants},
		http.StatusOK, "")
	closeAtEnd(t, a, "p-run")
	var started api.Run
	if err := json.Unmarshal(b, &started); err != nil || started.ID != "p-run" || started.Phase != "executing" {
		t.Fatalf("the platform's run: %s (%v)", b, err)
	}
	var listed []api.Run
	if err := json.Unmarshal(p.want("GET", "/v1/runs", nil, http.StatusOK, ""), &listed); err != nil ||
		len(listed) != 1 || listed[0].ID != "p-run" {
		t.Fatalf("the platform's list: %+v (%v); want p-run only", listed, err)
	}
	p.want("GET", "/v1/runs/p-run", nil, http.StatusOK, "")
	p.want("GET", "/v1/runs/op-run", nil, http.StatusNotFound, api.CodeNotFound)
	p.want("POST", "/v1/runs/op-run/close", nil, http.StatusNotFound, api.CodeNotFound)
	p.want("GET", "/v1/runs/op-run/verify", nil, http.StatusNotFound, api.CodeNotFound)
	p.want("GET", "/v1/runs/no-such-run", nil, http.StatusNotFound, api.CodeNotFound)
	other.want("GET", "/v1/runs/p-run", nil, http.StatusNotFound, api.CodeNotFound)
	other.want("POST", "/v1/runs/p-run/park", nil, http.StatusNotFound, api.CodeNotFound)
	if b := other.want("GET", "/v1/runs", nil, http.StatusOK, ""); strings.TrimSpace(string(b)) != "[]" {
		t.Fatalf("another platform key's list: %s", b)
	}

	// At its quota (--platform-runs 1): refused; once its run is closed,
	// it may start again.
	p.want("POST", "/v1/runs", api.RunRequest{ID: "p-two", Unit: unit.Spec{Image: oracleImage, Env: oracleEnv}, Grants: grants},
		http.StatusForbidden, api.CodeQuota)
	p.want("POST", "/v1/runs/p-run/park", nil, http.StatusOK, "")
	p.want("POST", "/v1/runs/p-run/close", map[string]string{"reason": "e2e"}, http.StatusOK, "")
	p.want("GET", "/v1/runs/p-run/verify", nil, http.StatusOK, "")

	// The operator keeps every route, the platform's runs included.
	if _, err := a.c.Show(ctx, "p-run"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.GC(ctx, nil, nil); err != nil {
		t.Fatalf("the operator's gc: %v", err)
	}
}

// adopt on the host that exported a run refuses it (handed_off): the
// bundle holds the run now, and the handoff stays, so a result posted or
// a resume there runs nothing. The very bundle taken back with
// import --reclaim makes it resumable there again.
func TestFleetAdoptExported(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, keyA := f.host(t, "exporter")
	const id = "exported"
	startOracle(t, a, id, oracleImage)
	park(t, a, id)
	var bundle bytes.Buffer
	if err := a.c.Export(ctx, id, &bundle); err != nil {
		t.Fatal(err)
	}
	_, err := a.c.Adopt(ctx, id)
	apiError(t, err, api.CodeHandedOff)
	r, err := a.run(ctx, id)
	if err != nil || !r.HandedOff {
		t.Fatalf("after the refused adopt: %+v, %v; want the run still handed off", r, err)
	}
	_, err = a.c.Resume(ctx, id)
	apiError(t, err, api.CodeHandedOff)
	if e, err := f.dir(t).Run(ctx, genesisOf(t, r)); err != nil || e.Owner.String() != keyA || e.Head.String() != r.Head {
		t.Fatalf("the directory after the refused adopt: %+v, %v", e, err)
	}
	if _, err := a.c.ImportWith(ctx, bytes.NewReader(bundle.Bytes()), id, true); err != nil {
		t.Fatalf("import --reclaim of the exported bundle: %v", err)
	}
	if r, err := a.run(ctx, id); err != nil || r.HandedOff || r.Phase != "parked" {
		t.Fatalf("after import --reclaim: %+v, %v; want it parked here", r, err)
	}
	if _, err := a.c.Resume(ctx, id); err != nil {
		t.Fatalf("resume after import --reclaim: %v", err)
	}
}

// `fleet revoke` cuts a platform key's live connection (an event stream)
// within 5 s, and its next handshake is refused; a revoked host's lease is
// gone, so its fence refuses a new run (not_owner), and it does not join
// again.
func TestFleetRevoke(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, keyA := f.hostWithout(t, "revoke-a")
	b, keyB := f.host(t, "revoke-b")
	p := newKeyClient(t, f, a, keyA, "platform")

	resp, err := p.c.Get(p.base + "/v1/events")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the platform's event stream: %v, %v", resp, err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ended <- err
	}()
	select {
	case err := <-ended:
		t.Fatalf("the event stream ended before any revocation: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	revokedAt := time.Now()
	out := f.cli(t, "fleet", "revoke", p.key)
	if !strings.Contains(out, "revoked "+p.key) {
		t.Fatalf("fleet revoke: %s", out)
	}
	select {
	case <-ended:
		t.Logf("the revoked key's stream was cut %v after the revocation", time.Since(revokedAt).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the revoked platform key's connection was still open 5 s after its revocation")
	}
	if _, _, err := p.do("GET", "/v1/runs", nil); err == nil {
		t.Fatal("a revoked platform key got through a new handshake")
	}

	out = f.cli(t, "fleet", "revoke", keyB)
	if !strings.Contains(out, "lease") || !strings.Contains(out, "revoked") {
		t.Fatalf("fleet revoke of a host: %s", out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := b.c.Start(ctx, api.RunRequest{ID: "after-revoke", Unit: unit.Spec{Image: oracleImage, Env: oracleEnv},
			Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork}})
		if err == nil {
			t.Fatal("a revoked host started a run")
		}
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeNotOwner {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a revoked host's start: %v, want not_owner", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if m, err := f.dir(t).Member(ctx, mustKey(t, keyB)); err == nil || m.Lease != 0 {
		t.Fatalf("the revoked host in the directory: %+v, %v", m, err)
	}
}

func mustKey(t *testing.T, text string) record.Address {
	t.Helper()
	k, err := record.ParseAddress(text)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The fleet over an etcd cluster of three member processes serving
// clients only over TLS, with a client certificate required and
// authentication on: the hosts and the fleet verbs reach it with
// --etcd-cacert, --etcd-cert, --etcd-key, --etcd-user and
// --etcd-password-file, as a user whose role reads and writes the fleet's
// prefix only. Two hosts join, a running oracle migrates from one to the
// other, and the directory names the second. Without the password, or
// without the client certificate, the fleet verbs are refused.
func TestFleetSecureEtcd(t *testing.T) {
	privileged(t)
	parallelFleet(t)
	ctx := context.Background()
	dir := t.TempDir()
	s, err := etcdtest.NewSecure(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := etcdtest.SpawnSecure(etcdMember, t.TempDir, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	const prefix = "/secure-fleet/"
	if err := c.Grant(ctx, "runrecordd", "host-password", prefix); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "etcd-password")
	if err := os.WriteFile(pw, []byte("host-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsFlags := []string{"--etcd-cacert", s.Path(etcdtest.CAFile), "--etcd-cert", s.Path(etcdtest.ClientCertFile),
		"--etcd-key", s.Path(etcdtest.ClientKeyFile)}
	f := &fleetEnv{c: c, endpoints: strings.Join(c.Endpoints(), ","), prefix: prefix,
		etcd: append(slices.Clone(tlsFlags), "--etcd-user", "runrecordd", "--etcd-password-file", pw)}

	// Refused: the certificate without the password; the password without
	// the certificate.
	base := []string{"fleet", "status", "--etcd", f.endpoints, "--etcd-prefix", prefix, "--etcd-timeout", "3s"}
	for name, extra := range map[string][]string{
		"no password":    tlsFlags,
		"no certificate": {"--etcd-cacert", s.Path(etcdtest.CAFile), "--etcd-user", "runrecordd", "--etcd-password-file", pw},
	} {
		if out, err := exec.Command(daemonBinary, append(slices.Clone(base), extra...)...).CombinedOutput(); err == nil {
			t.Fatalf("fleet status with %s: it answered\n%s", name, out)
		}
	}

	a, _ := f.host(t, "secure-a")
	b, keyB := f.host(t, "secure-b")
	const id = "secure-mover"
	started := startOracle(t, a, id, oracleImage)
	if _, err := a.c.Migrate(ctx, id, keyB); err != nil {
		t.Fatalf("migrate over the secure etcd: %v\n%s", err, a.logTail())
	}
	r, err := b.run(ctx, id)
	if err != nil || r.Phase != "executing" || r.Status != "running" {
		t.Fatalf("on the second host: %+v, %v", r, err)
	}
	e, err := f.dir(t).Run(ctx, mustKey(t, started.Head))
	if err != nil || e.Owner.String() != keyB || e.Head.String() != r.Head {
		t.Fatalf("directory %+v (%v), want owned by %s at %s", e, err, keyB, r.Head)
	}
	if out := f.cli(t, "fleet", "status"); !strings.Contains(out, "secure-b") || !strings.Contains(out, "orphaned runs: 0") {
		t.Fatalf("fleet status over the secure etcd:\n%s", out)
	}
}

// events opens p's event stream and returns its events as they come;
// the stream ends with the test.
func (p *platformClient) events() <-chan api.Event {
	p.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p.t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/v1/events", nil)
	if err != nil {
		p.t.Fatal(err)
	}
	c := &http.Client{Transport: p.c.Transport} // no timeout: the stream lasts the test
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		p.t.Fatalf("%s's event stream: %v, %v", p.key, resp, err)
	}
	out := make(chan api.Event, 64)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		dec := json.NewDecoder(resp.Body)
		for {
			var e api.Event
			if dec.Decode(&e) != nil {
				return
			}
			out <- e
		}
	}()
	return out
}

// next is the next event of ch for which want holds, failing t when
// none comes within 20 s; every event passed over is given to seen.
func next(t *testing.T, ch <-chan api.Event, want func(api.Event) bool, seen func(api.Event)) api.Event {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatal("the event stream ended")
			}
			if want(e) {
				return e
			}
			seen(e)
		case <-deadline:
			t.Fatal("no such event within 20 s")
		}
	}
}

// A platform key's event stream tells it every transition of the runs it
// starts, from their run.started on, and nothing of anyone else's runs.
func TestFleetPlatformEvents(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, keyA := f.host(t, "events-a")
	p := newKeyClient(t, f, a, keyA, "platform")
	other := newKeyClient(t, f, a, keyA, "platform")
	mine, theirs := p.events(), other.events()

	grants := unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork}
	startOracle(t, a, "ev-op", oracleImage)
	closeAtEnd(t, a, "ev-op")
	p.want("POST", "/v1/runs", api.RunRequest{ID: "ev-p", Unit: unit.Spec{Image: oracleImage, Env: oracleEnv}, Grants: grants},
		http.StatusOK, "")
	closeAtEnd(t, a, "ev-p")
	foreign := func(e api.Event) { t.Errorf("the platform key was told of %s %s", e.Kind, e.Run) }
	is := func(kind, run string) func(api.Event) bool {
		return func(e api.Event) bool { return e.Kind == kind && e.Run == run }
	}
	next(t, mine, is("run.started", "ev-p"), foreign)
	if _, err := a.c.Park(ctx, "ev-op"); err != nil {
		t.Fatal(err)
	}
	p.want("POST", "/v1/runs/ev-p/park", nil, http.StatusOK, "")
	next(t, mine, is("run.parked", "ev-p"), foreign)

	// The other key's stream, by now, has had every event it will be told
	// of the two runs: none.
	select {
	case e := <-theirs:
		t.Errorf("another platform key was told of %s %s", e.Kind, e.Run)
	case <-time.After(time.Second):
	}
}
