//go:build linux

package pageserver

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// A lazily restored task keeps its own userfaultfd open
// (deploy/criu/8-restored-tasks-keep-uffds.patch): so long as the task
// runs, its registered ranges stay registered, and a fault on a page
// that never came waits instead of reading zeros. Once every page is in,
// the ranges must be unregistered: a fault on a page the dump did not
// write (or one the unit dropped since) would otherwise wait for ever,
// lazy-pages gone. [LazyPages] does it when lazy-pages exits cleanly.

const (
	// uffdioUnregister is UFFDIO_UNREGISTER: _IOR(0xAA, 0x01, struct
	// uffdio_range { u64 start, len }).
	uffdioUnregister = 0x8010aa01
	// restoreFeatures are the features CRIU's lazy restore opens each
	// task's userfaultfd with (EVENT_FORK, EVENT_REMAP, EVENT_REMOVE,
	// EVENT_UNMAP), as its fdinfo's API line shows them once the kernel's
	// "initialized" bit (31) is taken off. A userfaultfd of the unit's own
	// has other features, and is left alone.
	restoreFeatures = 1<<1 | 1<<2 | 1<<3 | 1<<6
)

// UnregisterUnit unregisters, in process init (the unit's first process,
// a host pid) and each of its descendants, every range registered in
// missing mode ("um" in smaps' VmFlags) with a userfaultfd a lazy restore
// left open in that process. It returns how many ranges it unregistered.
// A range registered with another process's userfaultfd is refused by
// the kernel (EINVAL) and skipped; a process that exits meanwhile is
// passed over. Each userfaultfd is used once, in the first process found
// holding it (parents before children): one the unit duplicated, or a
// child inherited, costs no more ioctls.
func UnregisterUnit(init int) (int, error) {
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", init)); err != nil {
		return 0, fmt.Errorf("pageserver: the unit's first process: %w", err)
	}
	n := 0
	used := map[uint64]bool{}
	for _, pid := range descendants(init) {
		n += unregisterTask(pid, used)
	}
	return n, nil
}

// descendants is process pid and every process below it, from each
// process's parent in /proc/N/stat.
func descendants(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	kids := map[int][]int{}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p := parentOf(n); p > 0 {
			kids[p] = append(kids[p], n)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, kids[out[i]]...)
	}
	return out
}

// parentOf is process pid's parent, 0 when it cannot be read.
func parentOf(pid int) int {
	st, err := procStat(pid)
	if err != nil {
		return 0
	}
	return st.PPID
}

// procStat is process pid's /proc/PID/stat.
func procStat(pid int) (procfs.ProcStat, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return procfs.ProcStat{}, err
	}
	return p.Stat()
}

// unregisterTask unregisters process pid's registered ranges with each
// lazy restore's userfaultfd it holds not in used (by inode, added to
// it), and says how many.
func unregisterTask(pid int, used map[uint64]bool) int {
	fds := restoreUffds(pid, used)
	if len(fds) == 0 {
		return 0
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(pidfd)
	ranges := registered(pid)
	n := 0
	for _, fd := range fds {
		c, err := unix.PidfdGetfd(pidfd, fd, 0)
		if err != nil {
			continue
		}
		if isUserfaultfd(c) {
			for _, r := range ranges {
				if unregister(c, r) == nil {
					n++
				}
			}
		}
		unix.Close(c)
	}
	return n
}

// restoreUffds is the descriptors of process pid that are userfaultfds
// with a lazy restore's features, one per userfaultfd, leaving out those
// in used (inodes) and adding those it returns.
func restoreUffds(pid int, used map[uint64]bool) []int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	var fds []int
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err != nil || l != uffdLink {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(dir+"/"+e.Name(), &st) != nil || used[st.Ino] {
			continue
		}
		if f, ok := uffdFeatures(info); ok && f&^(1<<31) == restoreFeatures {
			n, _ := strconv.Atoi(e.Name())
			fds = append(fds, n)
			used[st.Ino] = true
		}
	}
	return fds
}

// uffdFeatures reads the features of a userfaultfd's fdinfo: its line
// "API:\t<api>:<features>:<ioctls>", in hexadecimal.
func uffdFeatures(info []byte) (uint64, bool) {
	for _, l := range strings.Split(string(info), "\n") {
		v, ok := strings.CutPrefix(l, "API:")
		if !ok {
			continue
		}
		parts := strings.Split(strings.TrimSpace(v), ":")
		if len(parts) != 3 {
			return 0, false
		}
		f, err := strconv.ParseUint(parts[1], 16, 64)
		return f, err == nil
	}
	return 0, false
}

// span is a range of addresses, [start, end).
type span struct{ start, end uint64 }

// registered is process pid's mappings registered with a userfaultfd in
// missing mode.
func registered(pid int) []span {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil
	}
	return parseRegistered(b)
}

// parseRegistered reads smaps: each mapping's header line
// ("start-end perms ..."), then its fields, VmFlags among them.
func parseRegistered(smaps []byte) []span {
	var out []span
	var cur span
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if flags, ok := strings.CutPrefix(l, "VmFlags:"); ok {
			for _, f := range strings.Fields(flags) {
				if f == "um" && cur.end > cur.start {
					out = append(out, cur)
					break
				}
			}
			continue
		}
		lo, rest, ok := strings.Cut(l, "-")
		if !ok || strings.Contains(lo, ":") {
			continue
		}
		hi, _, _ := strings.Cut(rest, " ")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		z, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil {
			cur = span{a, z}
		}
	}
	return out
}

// unregister is UFFDIO_UNREGISTER of r on userfaultfd fd.
func unregister(fd int, r span) error {
	arg := [2]uint64{r.start, r.end - r.start}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uffdioUnregister, uintptr(unsafe.Pointer(&arg)))
	if e != 0 {
		return e
	}
	return nil
}
