package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// gate starts the gate built into dir on a new FIFO, with argv args after
// it, and returns the FIFO and the running command.
func gate(t *testing.T, bin string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{fifo}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return fifo, cmd
}

// say opens fifo for writing (once the gate waits on it) and writes b
// (nothing when empty), then closes it.
func say(t *testing.T, fifo string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 {
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
}

// status is cmd's exit status.
func status(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatal(err)
	return -1
}

// The gate runs its argv (looked up on PATH) only after the word, and
// nothing of it without: another byte, or the FIFO's end alone, ends it
// with exitNoWord; an argv that cannot run, with exitNoExec.
func TestGate(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gate")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	mark := filepath.Join(t.TempDir(), "ran")
	for _, c := range []struct {
		name string
		word []byte
		argv []string
		want int
		ran  bool
	}{
		{"word", []byte("g"), []string{"touch", mark + "1"}, 0, true},
		{"other byte", []byte("x"), []string{"touch", mark + "2"}, exitNoWord, false},
		{"no word", nil, []string{"touch", mark + "3"}, exitNoWord, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fifo, cmd := gate(t, bin, c.argv...)
			time.Sleep(50 * time.Millisecond)
			if len(c.argv) == 2 {
				if _, err := os.Stat(c.argv[1]); err == nil {
					t.Fatal("the argv ran before the word")
				}
			}
			say(t, fifo, c.word)
			if got := status(t, cmd); got != c.want {
				t.Fatalf("exit status %d, want %d", got, c.want)
			}
			if len(c.argv) == 2 {
				if _, err := os.Stat(c.argv[1]); (err == nil) != c.ran {
					t.Fatalf("ran %v, want %v", err == nil, c.ran)
				}
			}
		})
	}
}

// An argv that cannot run ends the gate before the wait, as runc refuses
// it before waiting on its exec FIFO.
func TestGateNoSuchProgram(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gate")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	_, cmd := gate(t, bin, "runrecordd-no-such-program")
	done := make(chan int, 1)
	go func() { done <- status(t, cmd) }()
	select {
	case got := <-done:
		if got != exitNoExec {
			t.Fatalf("exit status %d, want %d", got, exitNoExec)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the gate waited for its word with an argv that cannot run")
	}
}
