//go:build linux

package criu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Binary is the criu binary's name, looked up on PATH where no path is
// given.
const Binary = "criu"

// Version runs `bin --version` and returns its version as
// MAJOR.MINOR.SUBLEVEL ("Version: 4.2" is 4.2.0).
func Version(ctx context.Context, bin string) (string, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("criu version: %w", err)
	}
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return "", fmt.Errorf("%s --version: no answer: %w", path, ctx.Err())
	}
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(l), "Version:")
		if !ok {
			continue
		}
		parts := strings.Split(strings.TrimSpace(v), ".")
		for len(parts) < 3 {
			parts = append(parts, "0")
		}
		for _, p := range parts[:3] {
			if _, err := strconv.Atoi(p); err != nil {
				return "", fmt.Errorf("%s --version: version %q", path, v)
			}
		}
		return strings.Join(parts[:3], "."), nil
	}
	return "", fmt.Errorf("%s --version: no version in %q", path, bytes.TrimSpace(out))
}

// Check runs `criu check` with the binary bin ([Binary] from PATH when
// empty) and returns nil only if it says "Looks good.": the kernel and
// CRIU can checkpoint at all. The error carries CRIU's output.
func Check(ctx context.Context, bin string) error {
	if bin == "" {
		bin = Binary
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return fmt.Errorf("criu check: %w", err)
	}
	out, err := exec.CommandContext(ctx, path, "check").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("Looks good.")) {
		return fmt.Errorf("%s check: %v: %s", path, err, bytes.TrimSpace(out))
	}
	return nil
}

// CheckLazy asks the criu binary bin whether this host can restore
// lazily: `criu check --feature uffd-noncoop` (userfaultfd with the events
// a lazy restore of a process tree needs).
func CheckLazy(ctx context.Context, bin string) error {
	out, err := exec.CommandContext(ctx, bin, "check", "--feature", "uffd-noncoop").CombinedOutput()
	if err != nil {
		return fmt.Errorf("criu check --feature uffd-noncoop: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// LeadPath is env with PATH led by the directory of the criu binary on
// PATH, so that every process started with it (containerd, its shims,
// runc) resolves the criu this process's checks see. env as it is when
// there is no criu on PATH.
func LeadPath(env []string) []string {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return env
	}
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "PATH=") {
			out = append(out, kv)
		}
	}
	return append(out, "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+path)
}

// LogTail is the end of a CRIU log, formatted to follow an error
// message, after the log's first error lines that end leaves out (CRIU
// logs what it undoes after the error that stopped it); empty when the
// log cannot be read.
func LogTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var errs []string
	if len(lines) > 12 {
		for _, l := range lines[:len(lines)-12] {
			if strings.Contains(l, "Error (") && len(errs) < 4 {
				errs = append(errs, l)
			}
		}
		lines = lines[len(lines)-12:]
	}
	first := ""
	if len(errs) > 0 {
		first = fmt.Sprintf("; errors in %s:\n%s", path, strings.Join(errs, "\n"))
	}
	return fmt.Sprintf("%s; end of %s:\n%s", first, path, strings.Join(lines, "\n"))
}

// ReadLogs reads CRIU's logs, one after another (a file that is not there
// is skipped).
func ReadLogs(paths ...string) []byte {
	var out []byte
	for _, p := range paths {
		b, _ := os.ReadFile(p)
		out = append(out, b...)
	}
	return out
}
