//go:build linux

package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
