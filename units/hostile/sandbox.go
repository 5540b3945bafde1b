package main

// The sandbox's attacks (test/e2e/attack_sandbox_test.go): what a unit
// can do to its host through the sandbox itself — processes, mounts, its
// root filesystem, its output — and what the sandbox lets it know about
// its own privileges.

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// envInt64 is the integer in environment variable name, def when unset.
func envInt64(name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 0, 64)
	if err != nil {
		say("bad %s=%q: %v", name, v, err)
		os.Exit(2)
	}
	return n
}

// init registers the sandbox's attacks by name; each function's comment
// says what its attack does.
func init() {
	attacks["fork-bomb"] = sandboxForkBomb
	attacks["submount-write"] = sandboxSubmountWrite
	attacks["socket-connect"] = sandboxSocketConnect
	attacks["sparse-file"] = sandboxSparseFile
	attacks["log-flood"] = sandboxLogFlood
	attacks["privileges"] = sandboxPrivileges
}

// sandboxForkBomb is attack "fork-bomb": it forks until fork fails, at
// most HOSTILE_FORKS times (default 2048, so that a host without a pids
// limit survives the test that shows it has none). Each child only pauses,
// in raw system calls: a forked copy of a Go process has one thread and
// must not run the Go runtime.
func sandboxForkBomb() {
	max := envInt64("HOSTILE_FORKS", 2048)
	n := int64(0)
	var ferr error
	for n < max {
		pid, _, errno := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
		if errno != 0 {
			ferr = errno
			break
		}
		if pid == 0 {
			for {
				_, _, _ = syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
			}
		}
		n++
	}
	if ferr != nil {
		say("forked %d; then fork failed: %v", n, ferr)
	} else {
		say("forked %d; no fork failed", n)
	}
}

// sandboxSubmountWrite is attack "submount-write": it writes a file at
// HOSTILE_PATH: a path under a read-only grant, in a writable host mount
// below the granted one.
func sandboxSubmountWrite() {
	p := os.Getenv("HOSTILE_PATH")
	err := os.WriteFile(p, []byte("written by the hostile unit\n"), 0o644)
	if err != nil {
		say("write %s refused: %v", p, err)
		return
	}
	say("wrote %s", p)
}

// sandboxSocketConnect is attack "socket-connect": it connects to the unix
// socket at HOSTILE_PATH (one a host daemon listens on, below a granted
// directory) and writes to it.
func sandboxSocketConnect() {
	p := os.Getenv("HOSTILE_PATH")
	c, err := net.Dial("unix", p)
	if err != nil {
		say("connect %s refused: %v", p, err)
		return
	}
	_, err = c.Write([]byte("hostile\n"))
	c.Close()
	say("connected to %s (write: %v)", p, err)
}

// sandboxSparseFile is attack "sparse-file": it makes a sparse file of
// HOSTILE_SIZE logical bytes (default 16 TiB less a block, ext4's largest)
// in its root filesystem: no disk space, but a rw layer capture that
// writes it at its logical size writes all of it.
func sandboxSparseFile() {
	size := envInt64("HOSTILE_SIZE", 16<<40-4096)
	f, err := os.Create("/sparse")
	if err == nil {
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		say("sparse file of %d bytes: %v", size, err)
		return
	}
	say("made /sparse of %d bytes", size)
}

// sandboxLogFlood is attack "log-flood": it writes HOSTILE_BYTES (default
// 64 MiB) to stderr, in 64 KiB lines, then says so on stdout.
func sandboxLogFlood() {
	total := envInt64("HOSTILE_BYTES", 64<<20)
	line := []byte(strings.Repeat("x", 64<<10-1) + "\n")
	var n int64
	for n < total {
		w, err := os.Stderr.Write(line)
		n += int64(w)
		if err != nil {
			say("stderr after %d bytes: %v", n, err)
			return
		}
	}
	say("flooded stderr with %d bytes", n)
}

// sandboxPrivileges is attack "privileges": it reports what the unit
// holds: effective capabilities, no_new_privs, seccomp mode and its uid
// map, from /proc/self.
func sandboxPrivileges() {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		say("status: %v", err)
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		switch k {
		case "CapEff", "CapBnd", "NoNewPrivs", "Seccomp":
			say("%s=%s", k, strings.TrimSpace(v))
		}
	}
	uidMap, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		say("uid_map: %v", err)
		return
	}
	say("uid_map=%s", strings.Join(strings.Fields(string(uidMap)), " "))
}
