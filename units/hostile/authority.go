package main

// The restored unit's authority (test/e2e/attack_seccomp_test.go): what
// a unit holds after a restore from images a signer rewrote.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

func init() {
	attacks["authority"] = authority
}

// authority is attack "authority": every 200 ms it reports, numbered,
// the seccomp mode of each of its threads (/proc/self/task/*/status),
// what add_key answers (a call the default seccomp profile refuses and
// the host's root may make), its oom_score_adj, its RLIMIT_CORE and
// every limit /proc/self/limits shows.
func authority() {
	for n := 1; ; n++ {
		say("report %d seccomp=%s add_key=%s oom_score_adj=%s core=%s limits=%s", n, threadModes(), addKey(), oomScoreAdj(), coreLimit(), limits())
		time.Sleep(200 * time.Millisecond)
	}
}

// threadModes is each thread's seccomp mode, comma-separated.
func threadModes() string {
	paths, _ := filepath.Glob("/proc/self/task/*/status")
	var modes []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread gone
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Seccomp:"); ok {
				modes = append(modes, strings.TrimSpace(v))
			}
		}
	}
	return strings.Join(modes, ",")
}

// addKey adds a key to the process's keyring: "ok", or the error.
func addKey() string {
	typ, desc, payload := []byte("user\x00"), []byte("hostile\x00"), []byte("x")
	ring := int32(-2) // KEY_SPEC_PROCESS_KEYRING
	_, _, errno := syscall.Syscall6(syscall.SYS_ADD_KEY, uintptr(unsafe.Pointer(&typ[0])), uintptr(unsafe.Pointer(&desc[0])),
		uintptr(unsafe.Pointer(&payload[0])), uintptr(len(payload)), uintptr(uint32(ring)), 0)
	if errno != 0 {
		return strings.ReplaceAll(errno.Error(), " ", "_")
	}
	return "ok"
}

func oomScoreAdj() string {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// coreLimit is RLIMIT_CORE, soft/hard.
func coreLimit() string {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_CORE, &r); err != nil {
		return "?"
	}
	return fmt.Sprintf("%d/%d", r.Cur, r.Max)
}

// limits is each row of /proc/self/limits, soft/hard ("unlimited" as
// inf), comma-separated in the kernel's order (the resources' numbers).
func limits() string {
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		return "?"
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n")[1:] {
		if len(l) < 68 {
			continue // the last, empty
		}
		// Columns: the name (25 and a space), soft and hard (20 and a
		// space each), units.
		v := func(f string) string { return strings.Replace(strings.TrimSpace(f), "unlimited", "inf", 1) }
		out = append(out, v(l[26:47])+"/"+v(l[47:68]))
	}
	return strings.Join(out, ",")
}
