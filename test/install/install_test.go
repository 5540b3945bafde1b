// Package install tests `make install`: the files the systemd unit expects,
// where it expects them.
package install

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// makeInstall runs `make install` at the repository's root into destdir
// with prefix, and returns its output.
func makeInstall(t *testing.T, destdir, prefix string) string {
	t.Helper()
	cmd := exec.Command("make", "-C", "../..", "install", "DESTDIR="+destdir, "PREFIX="+prefix)
	// Not the make that may run this test (make unit): its jobserver and
	// flags are not this one's.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}, name)
	})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	return string(out)
}

func TestMakeInstall(t *testing.T) {
	dest := t.TempDir()
	const prefix = "/opt/rr-install-test"
	makeInstall(t, dest, prefix)
	bin := filepath.Join(dest, prefix, "bin")
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{
		{filepath.Join(bin, "runrecordd"), 0o755},
		{filepath.Join(bin, "runrecordd-gate"), 0o755},
		{filepath.Join(dest, "etc/systemd/system/runrecordd.service"), 0o644},
		{filepath.Join(dest, "etc/default/runrecordd"), 0o644},
		{filepath.Join(dest, "etc/runrecordd/config.toml"), 0o644},
		{filepath.Join(dest, prefix, "share/man/man1/runrecordd.1.gz"), 0o644},
		{filepath.Join(dest, prefix, "share/bash-completion/completions/runrecordd"), 0o644},
		{filepath.Join(dest, prefix, "share/zsh/site-functions/_runrecordd"), 0o644},
		{filepath.Join(dest, prefix, "share/fish/vendor_completions.d/runrecordd.fish"), 0o644},
	} {
		st, err := os.Stat(f.path)
		if err != nil {
			t.Errorf("not installed: %v", err)
			continue
		}
		if st.Mode().Perm() != f.mode || !st.Mode().IsRegular() {
			t.Errorf("%s: mode %v, want %v", f.path, st.Mode(), f.mode)
		}
	}
	for _, f := range []string{"etc/default/runrecordd", "etc/runrecordd/config.toml"} {
		want, _ := os.ReadFile(filepath.Join("../../deploy", map[string]string{
			"etc/default/runrecordd": "systemd/runrecordd.env", "etc/runrecordd/config.toml": "config.toml"}[f]))
		if got, _ := os.ReadFile(filepath.Join(dest, f)); string(got) != string(want) || len(want) == 0 {
			t.Errorf("%s is not the shipped file", f)
		}
	}

	// The unit starts the installed binary, and names the files installed.
	unit, err := os.ReadFile(filepath.Join(dest, "etc/systemd/system/runrecordd.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "\nExecStart="+prefix+"/bin/runrecordd serve ") {
		t.Errorf("the unit's ExecStart does not start %s/bin/runrecordd:\n%s", prefix, unit)
	}
	if !strings.Contains(string(unit), "\nEnvironmentFile=-/etc/default/runrecordd\n") {
		t.Errorf("the unit reads no /etc/default/runrecordd")
	}

	// The installed binary runs, and reads the installed config: every key
	// of it accepted (a config error comes before the flags' checks).
	out, err := exec.Command(filepath.Join(bin, "runrecordd"), "version", "-o", "json").Output()
	var v struct{ Version, Go string }
	if err != nil || json.Unmarshal(out, &v) != nil || v.Version == "" || v.Go == "" {
		t.Fatalf("installed runrecordd version: %q, %v", out, err)
	}
	// The man page and the completions are the installed binary's own.
	share := filepath.Join(dest, prefix, "share")
	for _, f := range []struct {
		path string
		args []string
	}{
		{"man/man1/runrecordd.1.gz", []string{"man"}},
		{"bash-completion/completions/runrecordd", []string{"completion", "bash"}},
		{"zsh/site-functions/_runrecordd", []string{"completion", "zsh"}},
		{"fish/vendor_completions.d/runrecordd.fish", []string{"completion", "fish"}},
	} {
		want, err := exec.Command(filepath.Join(bin, "runrecordd"), f.args...).Output()
		if err != nil || len(want) == 0 {
			t.Fatalf("runrecordd %s: %v", strings.Join(f.args, " "), err)
		}
		got, err := os.ReadFile(filepath.Join(share, f.path))
		if err == nil && strings.HasSuffix(f.path, ".gz") {
			got, err = gunzip(got)
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not `runrecordd %s` (%v)", f.path, strings.Join(f.args, " "), err)
		}
	}

	cfg := filepath.Join(dest, "etc/runrecordd/config.toml")
	body, _ := os.ReadFile(cfg)
	var uncommented []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "#") && strings.Contains(line, " = ") && !strings.HasPrefix(line, "# ") {
			line = line[1:]
		}
		uncommented = append(uncommented, line)
	}
	all := filepath.Join(t.TempDir(), "all.toml")
	if err := os.WriteFile(all, []byte(strings.Join(uncommented, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(filepath.Join(bin, "runrecordd"), "serve", "--config", all, "--log-format", "xml").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--log-format xml: want text or json") {
		t.Fatalf("serve with the installed config, every key set: %v\n%s", err, out)
	}

	// Installed again: an edited config and environment file are kept, the
	// shipped ones put beside them.
	if err := os.WriteFile(cfg, []byte("log-level = \"debug\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	makeInstall(t, dest, prefix)
	if got, _ := os.ReadFile(cfg); string(got) != "log-level = \"debug\"\n" {
		t.Errorf("a second install replaced the edited config: %q", got)
	}
	for _, f := range []string{cfg + ".new", filepath.Join(dest, "etc/default/runrecordd.new")} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the shipped file is not beside the kept one: %v", err)
		}
	}
}

func gunzip(b []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// TestMakeInstallUsr: with PREFIX=/usr, zsh's completion goes to Debian's
// vendor-completions, the others under /usr/share as under any prefix.
func TestMakeInstallUsr(t *testing.T) {
	dest := t.TempDir()
	makeInstall(t, dest, "/usr")
	for _, f := range []string{"share/zsh/vendor-completions/_runrecordd", "share/man/man1/runrecordd.1.gz",
		"share/bash-completion/completions/runrecordd", "share/fish/vendor_completions.d/runrecordd.fish"} {
		if _, err := os.Stat(filepath.Join(dest, "usr", f)); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
	if _, err := os.Stat(filepath.Join(dest, "usr/share/zsh/site-functions")); err == nil {
		t.Errorf("PREFIX=/usr installed under zsh's site-functions, not vendor-completions")
	}
}
