package main

// Attack "owners" (test/e2e/rwlayer_test.go): files in the rw layer
// owned by ids of the sandbox's user namespace, and a file capability its
// root sets, which the kernel stores with the host id of that root. The
// unit reports what it sees of them, again and again, so a test reads
// them after a park and a resume on another host's range.

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"
	"time"
)

func init() { attacks["owners"] = owners }

// owners makes /owned-root (0:0), /owned-1000 (1000:1000) and
// /owned-cap with CAP_NET_RAW in its permitted set (a revision 2
// security.capability, which the kernel turns into a revision 3 one
// naming the namespace's root), then says every 200 ms "owners: " and
// each file's owner and its capability as this namespace reads it: its
// size, or the error.
func owners() {
	for _, f := range []struct {
		name string
		id   int
	}{{"/owned-root", 0}, {"/owned-1000", 1000}, {"/owned-cap", 0}} {
		if err := os.WriteFile(f.name, []byte(f.name), 0o644); err != nil {
			say("made: %v", err)
			return
		}
		if err := os.Chown(f.name, f.id, f.id); err != nil {
			say("made: %v", err)
			return
		}
	}
	capV2 := make([]byte, 20)
	binary.LittleEndian.PutUint32(capV2[0:], 0x02000000) // revision 2
	binary.LittleEndian.PutUint32(capV2[4:], 1<<13)      // CAP_NET_RAW permitted
	if err := syscall.Setxattr("/owned-cap", "security.capability", capV2, 0); err != nil {
		say("made: setcap: %v", err)
		return
	}
	for {
		line := "seen:"
		for _, name := range []string{"/owned-root", "/owned-1000"} {
			var st syscall.Stat_t
			if err := syscall.Stat(name, &st); err != nil {
				line += fmt.Sprintf(" %s=%v", name, err)
				continue
			}
			line += fmt.Sprintf(" %s=%d:%d", name, st.Uid, st.Gid)
		}
		buf := make([]byte, 64)
		n, err := syscall.Getxattr("/owned-cap", "security.capability", buf)
		if err != nil {
			line += fmt.Sprintf(" cap=%v", err)
		} else {
			line += fmt.Sprintf(" cap=%d", n)
		}
		say("%s", line)
		time.Sleep(200 * time.Millisecond)
	}
}
