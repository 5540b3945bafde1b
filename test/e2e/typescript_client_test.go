//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// node is the Node.js the TypeScript client is tested with: /usr/bin/node,
// else node on PATH. None fails the test.
func node(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/node"); err == nil {
		return "/usr/bin/node"
	}
	p, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("no node to test clients/typescript with: %v", err)
	}
	return p
}

// typescriptDrive runs testdata/typescript_client.mjs against
// clients/typescript/runrecordd.js with env.
func typescriptDrive(t *testing.T, env ...string) map[string]any {
	t.Helper()
	client, err := filepath.Abs("../../clients/typescript/runrecordd.js")
	if err != nil {
		t.Fatal(err)
	}
	return driveClient(t, []string{node(t), "testdata/typescript_client.mjs"}, append(env, "RR_CLIENT="+client)...)
}

// The TypeScript client drives a real daemon over its unix socket, as
// TestPythonClientSocket does the Python one.
func TestTypeScriptClientSocket(t *testing.T) {
	privileged(t)
	d := trShared(t)
	closeAtEnd(t, d, "ts-sock-agent")
	closeAtEnd(t, d, "ts-sock-oracle")
	clientChecked(t, typescriptDrive(t, "RR_SOCKET="+d.socket, "RR_PREFIX=ts-sock"),
		"run.started", "run.parked", "run.resumed", "run.closed", "call.dispatched", "call.result")
}

// The TypeScript client over mTLS as a platform key, as
// TestPythonClientTLS does the Python one (its note on run.started holds
// here too).
func TestTypeScriptClientTLS(t *testing.T) {
	privileged(t)
	f := fleetCluster(t)
	d, _ := f.start(t, "ts-tls", append(f.flags(), "--lease-ttl", "10s"))
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	closeAtEnd(t, d, "ts-tls-agent")
	closeAtEnd(t, d, "ts-tls-oracle")
	dir := t.TempDir()
	key := cli(t, "fleet", "key", "--tls-out", dir)
	f.cli(t, "fleet", "admit", key, "--name", "ts-platform", "--role", "platform")
	pin := cli(t, "fleet", "key", "--public", "--state-dir", d.state)
	got := typescriptDrive(t, "RR_ADDR="+peerAddrOf(t, d), "RR_CERT="+filepath.Join(dir, "cert.pem"),
		"RR_KEY="+filepath.Join(dir, "key.pem"), "RR_PIN="+pin, "RR_PREFIX=ts-tls",
		"RR_WANT_EVENTS=run.parked run.resumed run.closed")
	if got["pin"] != "refused" {
		t.Errorf("a wrong pin: %v, want refused", got["pin"])
	}
	clientChecked(t, got, "run.parked", "run.resumed", "run.closed", "call.dispatched", "call.result")
}
