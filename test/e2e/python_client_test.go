//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// python is the Python 3 the client is tested with: the system's
// (/usr/bin/python3, what the client's users have), else python3 on PATH.
// None fails the test: the client ships, so it is tested.
func python(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("no python3 to test clients/python with: %v", err)
	}
	return p
}

// pythonDrive runs testdata/python_client.py, with clients/python on its
// path and env, and returns what it printed.
func pythonDrive(t *testing.T, env ...string) map[string]any {
	t.Helper()
	clients, err := filepath.Abs("../../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	return driveClient(t, []string{python(t), "testdata/python_client.py"}, append(env, "PYTHONPATH="+clients, "PYTHONDONTWRITEBYTECODE=1")...)
}

// driveClient runs a client's driver (argv) with env and the images,
// and returns the JSON object it printed.
func driveClient(t *testing.T, argv []string, env ...string) map[string]any {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), append(env, "RR_AGENT="+trAgentImage, "RR_ORACLE="+oracleImage)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	done := make(chan struct{})
	timer := time.AfterFunc(4*time.Minute, func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.Output()
	close(done)
	if err != nil {
		t.Fatalf("%s: %v\n%s", argv[1], err, stderr.String())
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s printed %q: %v\n%s", argv[1], out, err, stderr.String())
	}
	return got
}

// clientChecked checks what the driver saw: the transitions want on the
// events stream, the agent's record past its park and resume, and the
// oracle's secret given at its start and again at its resume.
func clientChecked(t *testing.T, got map[string]any, want ...string) {
	t.Helper()
	var kinds []string
	for _, k := range got["events"].([]any) {
		kinds = append(kinds, k.(string))
	}
	for _, k := range want {
		if !slices.Contains(kinds, k) {
			t.Errorf("the events stream had %v, not %s", kinds, k)
		}
	}
	if got["secrets"] != "given" {
		t.Errorf("the oracle's secret: %v, want given", got["secrets"])
	}
	if n, _ := got["agent_segments"].(float64); n < 3 {
		t.Errorf("the agent's record has %v segments, want executed, suspended, resumed, ...", got["agent_segments"])
	}
	t.Logf("client: %v", got)
}

// The Python client (clients/python) drives a real daemon as the
// operator, over its unix socket: the OpenAPI document; a transcript
// agent run, its call listed and its result posted, which resumes it to
// its end; an image-mode oracle parked, resumed and closed; show, list,
// verify and logs (when the daemon serves them); a typed not_found; and
// the events stream of it all.
func TestPythonClientSocket(t *testing.T) {
	privileged(t)
	d := trShared(t)
	closeAtEnd(t, d, "py-sock-agent")
	closeAtEnd(t, d, "py-sock-oracle")
	clientChecked(t, pythonDrive(t, "RR_SOCKET="+d.socket, "RR_PREFIX=py-sock"),
		"run.started", "run.parked", "run.resumed", "run.closed", "call.dispatched", "call.result")
}

// The same over the fleet's mutual-TLS listener, as a platform key made
// by `fleet key --tls-out` and admitted with --role platform, pinned to
// the host's raw key (`fleet key --public`); and the host's facts refused
// it (forbidden), a server not holding the pinned key refused.
//
// A platform key's stream may lack run.started of its runs: the event
// races the run's booking to the key (server.platformStart), and the
// stream's filter leaves it out when it comes first. Known, not this
// client's (docs/clients.md): the test asks for the rest.
func TestPythonClientTLS(t *testing.T) {
	privileged(t)
	f := fleetCluster(t)
	d, _ := f.start(t, "py-tls", append(f.flags(), "--lease-ttl", "10s"))
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	closeAtEnd(t, d, "py-tls-agent")
	closeAtEnd(t, d, "py-tls-oracle")
	dir := t.TempDir()
	key := cli(t, "fleet", "key", "--tls-out", dir)
	f.cli(t, "fleet", "admit", key, "--name", "py-platform", "--role", "platform")
	pin := cli(t, "fleet", "key", "--public", "--state-dir", d.state)
	got := pythonDrive(t, "RR_ADDR="+peerAddrOf(t, d), "RR_CERT="+filepath.Join(dir, "cert.pem"),
		"RR_KEY="+filepath.Join(dir, "key.pem"), "RR_PIN="+pin, "RR_PREFIX=py-tls",
		"RR_WANT_EVENTS=run.parked run.resumed run.closed")
	if got["pin"] != "refused" {
		t.Errorf("a wrong pin: %v, want refused", got["pin"])
	}
	clientChecked(t, got, "run.parked", "run.resumed", "run.closed", "call.dispatched", "call.result")
}
