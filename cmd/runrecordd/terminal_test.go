package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair: the terminal side a program writes
// to, and the controlling side.
func openPTY(t *testing.T) (term, ctl *os.File) {
	t.Helper()
	ctl, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { ctl.Close() })
	if err := unix.IoctlSetPointerInt(int(ctl.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ctl.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	term, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Close() })
	return term, ctl
}

// export to a terminal is refused before the daemon is asked anything: the
// socket here has no daemon, which would be exit 3.
func TestExportRefusesTerminal(t *testing.T) {
	term, _ := openPTY(t)
	if !isTerminal(term) {
		t.Fatal("a pty's terminal side is not a terminal")
	}
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, args := range [][]string{{"export", "r1", "--socket", sock}, {"export", "r1", "-f", "-", "--socket", sock}} {
		var stderr bytes.Buffer
		if code := run(args, term, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2; stderr %s", args, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), "refusing to write a bundle to a terminal") {
			t.Errorf("%v: stderr %q", args, stderr.String())
		}
	}
	// Not a terminal: the export goes on to the daemon (none here: 3).
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stderr bytes.Buffer
	if code := run([]string{"export", "r1", "--socket", sock}, f, &stderr); code != 3 {
		t.Errorf("export to a file: exit %d, want 3; stderr %s", code, stderr.String())
	}
}
