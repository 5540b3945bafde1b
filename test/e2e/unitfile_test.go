//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/host"
)

// unitFile is the systemd unit deploy/ ships.
const unitFile = "../../deploy/systemd/runrecordd.service"

// TestSystemdUnit checks deploy/systemd/runrecordd.service against the
// daemon: Type=notify, notifications from the main process only, a
// watchdog, and a StateDirectory= that is the daemon's default state
// directory and the one ExecStart names. Where systemd-analyze is
// installed (systemd is not PID 1 here; the package is), the unit must
// verify with nothing said, its ExecStart pointed at an executable that
// exists.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = v
		}
	}
	for k, want := range map[string]string{"Type": "notify", "NotifyAccess": "main", "KillMode": "process"} {
		if keys[k] != want {
			t.Errorf("%s=%s, want %s", k, keys[k], want)
		}
	}
	if keys["WatchdogSec"] == "" {
		t.Error("no WatchdogSec=")
	}
	state := filepath.Join("/var/lib", keys["StateDirectory"])
	if keys["StateDirectory"] == "" || state != host.DefaultStateDir {
		t.Errorf("StateDirectory=%s is %s; the daemon's default state directory is %s", keys["StateDirectory"], state, host.DefaultStateDir)
	}
	if !strings.Contains(keys["ExecStart"], " serve --state-dir "+host.DefaultStateDir+" ") {
		t.Errorf("ExecStart=%s does not name --state-dir %s", keys["ExecStart"], host.DefaultStateDir)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is not installed (deploy/setup.sh installs Debian's systemd for it): %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "runrecordd.service")
	body := strings.ReplaceAll(string(b), "/usr/local/bin/runrecordd", self)
	if err := os.WriteFile(unit, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", unit).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// envFile is the environment file deploy/ ships for the unit.
const envFile = "../../deploy/systemd/runrecordd.env"

// configFile is the config deploy/ ships, installed as
// /etc/runrecordd/config.toml.
const configFile = "../../deploy/config.toml"

// unitKeys are the [Service] assignments of the shipped unit, comments
// left out (a key given twice: its last value).
func unitKeys(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = v
		}
	}
	return keys
}

// asUnit has d started as the shipped unit starts it, under systemd: the
// unit's ExecStart arguments, $RUNRECORDD_ARGS from the shipped
// environment file, the shipped config file (the default path's, named),
// and systemd's variables: $INVOCATION_ID, $NOTIFY_SOCKET (notify, a
// socket as notifySocket listens on) and $WATCHDOG_USEC from
// WatchdogSec=. The state directory the unit names is d's.
func asUnit(t *testing.T, notify string) func(*daemon) {
	t.Helper()
	keys := unitKeys(t)
	execStart := strings.Fields(keys["ExecStart"])
	if len(execStart) < 2 || filepath.Base(execStart[0]) != "runrecordd" || execStart[1] != "serve" {
		t.Fatalf("ExecStart=%s: not runrecordd serve", keys["ExecStart"])
	}
	env, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	var extra string
	for _, line := range strings.Split(string(env), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "RUNRECORDD_ARGS="); ok {
			extra = strings.Trim(v, `"`)
		}
	}
	watchdog, err := time.ParseDuration(keys["WatchdogSec"])
	if err != nil {
		t.Fatalf("WatchdogSec=%s: %v", keys["WatchdogSec"], err)
	}
	return func(d *daemon) {
		var args []string
		for _, a := range execStart[2:] {
			switch a {
			case "$RUNRECORDD_ARGS", "${RUNRECORDD_ARGS}":
				args = append(args, strings.Fields(extra)...)
			case host.DefaultStateDir:
				args = append(args, d.state)
			default:
				args = append(args, a)
			}
		}
		d.flags = append(append(args, "--config", configFile), d.flags...)
		d.env = []string{"INVOCATION_ID=e2e" + d.name, "NOTIFY_SOCKET=" + notify,
			fmt.Sprintf("WATCHDOG_USEC=%d", watchdog.Microseconds())}
		d.stopDefault = true
	}
}
