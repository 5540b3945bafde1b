//go:build linux

package criu

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Version reads "Version: MAJOR.MINOR[.SUBLEVEL]" from a criu's answer,
// and refuses an answer without one.
func TestVersion(t *testing.T) {
	dir := t.TempDir()
	for answer, want := range map[string]string{
		"Version: 4.2\n":             "4.2.0",
		"Version: 4.2.1\nGitID: x\n": "4.2.1",
		"criu\n  Version: 3.19.1 \n": "3.19.1",
		"Version: 4.x\n":             "",
		"nothing\n":                  "",
	} {
		bin := filepath.Join(dir, "criu")
		if err := os.WriteFile(bin, []byte("#!/bin/sh\nprintf '"+answer+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		got, err := Version(t.Context(), bin)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("%q: %q, %v; want %q", answer, got, err, want)
		}
		os.Remove(bin)
	}
}

// LeadPath puts the directory of the criu on PATH first, once.
func TestLeadPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, Binary), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":/usr/bin:/bin")
	env := LeadPath([]string{"A=1", "PATH=/elsewhere", "B=2"})
	if len(env) != 3 || env[0] != "A=1" || env[1] != "B=2" || env[2] != "PATH="+dir+":"+dir+":/usr/bin:/bin" {
		t.Fatalf("env %q", env)
	}
	t.Setenv("PATH", "/nonexistent")
	if env := LeadPath([]string{"PATH=/x"}); strings.Join(env, " ") != "PATH=/x" {
		t.Fatalf("without criu: %q", env)
	}
}

// A CRIU log's error that its last 12 lines leave out (what CRIU undid
// after it) is still in LogTail, before them; a short log is all there.
func TestLogTail(t *testing.T) {
	dir := t.TempDir()
	long := []string{"(00.001) start", "(00.002) Error (criu/files.c:560): the cause"}
	for i := range 20 {
		long = append(long, fmt.Sprintf("(00.%03d) undoing %d", i+3, i))
	}
	long = append(long, "(00.100) Error (criu/cr-dump.c:1975): Dumping FAILED.")
	p := filepath.Join(dir, "dump.log")
	if err := os.WriteFile(p, []byte(strings.Join(long, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := LogTail(p)
	want := fmt.Sprintf("; errors in %s:\n%s; end of %s:\n%s", p, long[1], p, strings.Join(long[len(long)-12:], "\n"))
	if got != want {
		t.Fatalf("LogTail:\n%s\nwant:\n%s", got, want)
	}
	if err := os.WriteFile(p, []byte(strings.Join(long[:3], "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := LogTail(p), fmt.Sprintf("; end of %s:\n%s", p, strings.Join(long[:3], "\n")); got != want {
		t.Fatalf("LogTail of a short log: %q, want %q", got, want)
	}
	if got := LogTail(filepath.Join(dir, "none.log")); got != "" {
		t.Fatalf("LogTail of no log: %q", got)
	}
}
