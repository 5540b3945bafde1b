//go:build linux

package pageserver

import (
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// The mappings registered in missing mode are read from smaps: each
// header's range, taken when its VmFlags hold "um" (not "uw", "ui").
func TestParseRegistered(t *testing.T) {
	smaps := []byte(`55d4c0a00000-55d4c0a21000 r-xp 00000000 08:01 1234   /unit
Size:                132 kB
VmFlags: rd ex mr mw me dw
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Size:              65536 kB
VmFlags: rd wr mr mw me ac sd um
7f0004000000-7f0004001000 rw-p 00000000 00:00 0
VmFlags: rd wr mr mw me ac sd uw
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
Name:           a-b
VmFlags: rd wr mr mw me gd ac um
`)
	got := parseRegistered(smaps)
	want := []span{{0x7f0000000000, 0x7f0004000000}, {0x7ffc00000000, 0x7ffc00021000}}
	if !slices.Equal(got, want) {
		t.Fatalf("parseRegistered = %x, want %x", got, want)
	}
}

// A userfaultfd's features are its fdinfo's API line's second field,
// in hexadecimal.
func TestUffdFeatures(t *testing.T) {
	for _, c := range []struct {
		info string
		want uint64
		ok   bool
	}{
		{"pos:\t0\nflags:\t02004000\nmnt_id:\t15\nino:\t1057\npending:\t0\ntotal:\t0\nAPI:\taa:8000004e:1fc0000000000000\n", 0x8000004e, true},
		{"pending:\t0\nAPI:\taa:4e\n", 0, false},
		{"pending:\t0\n", 0, false},
	} {
		f, ok := uffdFeatures([]byte(c.info))
		if f != c.want || ok != c.ok {
			t.Errorf("uffdFeatures(%q) = %#x, %v; want %#x, %v", c.info, f, ok, c.want, c.ok)
		}
	}
	const seen = 0x8000004e // a lazy restore's userfaultfd on kernel 6.18
	if restoreFeatures != seen&^(1<<31) {
		t.Errorf("a lazy restore's userfaultfd (features 0x8000004e) not recognised")
	}
}

// A process's descendants are found through their parents: this test's
// child, and that child's own.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The whole group: sh and its sleep.
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
	sh := cmd.Process.Pid
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		d := descendants(os.Getpid())
		grand := slices.ContainsFunc(d, func(p int) bool { return parentOf(p) == sh })
		if d[0] == os.Getpid() && slices.Contains(d, sh) && grand {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("descendants %v: want this process, %d and its child", d, sh)
		}
	}
}
