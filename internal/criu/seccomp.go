package criu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/seccomp"
	"google.golang.org/protobuf/proto"
)

// A task's seccomp filters are in seccomp.img, one list for all tasks;
// each thread's core names the index of the filter CRIU installs first,
// and each filter's prev the one installed after it (CRIU 4.2,
// criu/seccomp.c). A thread with no mode of its own, beside a thread
// group leader whose filters all carry SECCOMP_FILTER_FLAG_TSYNC, is
// CRIU's way of writing threads that share the leader's filters: the
// leader's install synchronises them.

// Filter is one seccomp filter: its classic BPF instructions as the
// kernel returns them (struct sock_filter, 8 bytes each) and its flags
// (SECCOMP_FILTER_FLAG_*).
type Filter struct {
	Insns []byte
	Flags uint32
}

// Bounds of seccomp filters (linux/filter.h, kernel/seccomp.c) and the
// flags an image's filter may carry.
const (
	maxFilterInsns = 4096  // BPF_MAXINSNS
	maxPathInsns   = 32768 // MAX_INSNS_PER_PATH: a thread's filters, 4 more for each
	seccompTsync   = 1     // SECCOMP_FILTER_FLAG_TSYNC
	seccompLog     = 2     // SECCOMP_FILTER_FLAG_LOG
	seccompMagic   = 0x64413049
	coreMagic      = 0x55053847
)

// seccompChain judges the seccomp filters thread tid of task pid is
// restored with: it returns the index of the first, and the instructions
// of the chain with the kernel's 4 for each filter. A thread in mode 0,
// or in strict mode (which a filter's thread cannot enter), is refused,
// but for a thread that shares its leader's filters (TSYNC).
func (im *Images) seccompChain(pid, tid uint32) (uint32, int, error) {
	name := fmt.Sprintf("core-%d.img", tid)
	c := im.Cores[tid]
	if c == nil {
		return 0, 0, refuse(pid, name, "", "missing")
	}
	if tc := c.GetTc(); tc != nil && (tc.OldSeccompMode != nil || tc.OldSeccompFilter != nil) {
		return 0, 0, refuse(pid, name, "tc.old_seccomp_mode", "older images' seccomp: CRIU 4 keeps it per thread")
	}
	th := c.GetThreadCore()
	switch mode := th.GetSeccompMode(); {
	case mode == criucore.SeccompMode_filter:
	case mode == criucore.SeccompMode_disabled && tid != pid:
		first, n, tsync, err := im.walkSeccomp(pid, fmt.Sprintf("core-%d.img", pid), pid)
		if err == nil && !tsync {
			err = refuse(pid, name, "thread_core.seccomp_mode", "%s, and its leader's filters are its own: the sandbox has a seccomp filter", mode)
		}
		return first, n, err
	default:
		return 0, 0, refuse(pid, name, "thread_core.seccomp_mode", "%s, the sandbox has a seccomp filter", mode)
	}
	first, n, _, err := im.walkSeccomp(pid, name, tid)
	return first, n, err
}

// walkSeccomp follows thread tid's filters (its core is name, in filter
// mode): each within the kernel's bounds, of the flags an image may
// carry, no index out of range or seen twice. tsync says whether every
// filter carries TSYNC.
func (im *Images) walkSeccomp(pid uint32, name string, tid uint32) (uint32, int, bool, error) {
	th := im.Cores[tid].GetThreadCore()
	if th.GetSeccompMode() != criucore.SeccompMode_filter {
		return 0, 0, false, refuse(pid, name, "thread_core.seccomp_mode", "%s, the sandbox has a seccomp filter", th.GetSeccompMode())
	}
	if th.SeccompFilter == nil {
		return 0, 0, false, refuse(pid, name, "thread_core.seccomp_filter", "missing")
	}
	fs := im.Seccomp.GetSeccompFilters()
	first := th.GetSeccompFilter()
	seen := map[uint32]bool{}
	insns, tsync := 0, true
	for i, more := first, true; more; {
		if int(i) >= len(fs) {
			return 0, 0, false, refuse(pid, "seccomp.img", "seccomp_filters", "filter %d of %d (from %s)", i, len(fs), name)
		}
		if seen[i] {
			return 0, 0, false, refuse(pid, "seccomp.img", "seccomp_filters.prev", "filter %d comes twice in one chain", i)
		}
		seen[i] = true
		f := fs[i]
		n := len(f.GetFilter())
		if n == 0 || n%8 != 0 || n/8 > maxFilterInsns {
			return 0, 0, false, refuse(pid, "seccomp.img", "seccomp_filters.filter", "filter %d: %d bytes, not 1 to %d instructions", i, n, maxFilterInsns)
		}
		if fl := f.GetFlags(); fl&^(seccompTsync|seccompLog) != 0 {
			return 0, 0, false, refuse(pid, "seccomp.img", "seccomp_filters.flags", "filter %d: flags %#x, past TSYNC and LOG", i, fl)
		}
		tsync = tsync && f.GetFlags()&seccompTsync != 0
		if insns += n/8 + 4; insns > maxPathInsns {
			return 0, 0, false, refuse(pid, "seccomp.img", "seccomp_filters", "a chain of more than %d instructions", maxPathInsns)
		}
		i, more = f.GetPrev(), f.Prev != nil
	}
	return first, insns, tsync, nil
}

// Stack rewrites the image directory dir, whose images im are and which
// Judge has passed under a policy with a seccomp filter, so that every
// thread of every task is restored in filter mode with host — the
// spec's filters as this host's runtime compiles them, in the order they
// are installed — installed before its own, unless its chain holds them
// already, byte for byte (a chain restored here before). Filters only
// narrow: the images' own need no other comparison with the spec's. No filter keeps TSYNC
// (each thread is given its chain, and a synchronising install would
// fail beside another's copy). It writes seccomp.img and the cores
// (core-TID.img) it changes anew, with the owner and mode of the file
// each replaces.
func (im *Images) Stack(dir string, host []Filter) error {
	if len(host) == 0 {
		return fmt.Errorf("criu: no filter to stack")
	}
	hostInsns := 0
	for _, h := range host {
		if n := len(h.Insns); n == 0 || n%8 != 0 || n/8 > maxFilterInsns {
			return fmt.Errorf("criu: a host filter of %d bytes", n)
		}
		hostInsns += len(h.Insns)/8 + 4
	}
	// Every chain is read before anything changes (a thread sharing its
	// leader's filters is known by their TSYNC).
	firsts := map[uint32]uint32{} // thread: the first filter of its chain
	for _, t := range im.Tasks {
		pid := t.GetPid()
		for _, tid := range t.GetThreads() {
			first, n, err := im.seccompChain(pid, tid)
			if err != nil {
				return err
			}
			if im.Cores[tid].GetThreadCore() == nil { // Judge refuses it too (its creds)
				return refuse(pid, fmt.Sprintf("core-%d.img", tid), "thread_core", "missing")
			}
			if n+hostInsns > maxPathInsns {
				return refuse(pid, "seccomp.img", "seccomp_filters", "a chain of %d instructions, %d with the spec's: more than the kernel's %d", n, n+hostInsns, maxPathInsns)
			}
			firsts[tid] = first
		}
	}
	if im.Seccomp == nil {
		im.Seccomp = &seccomp.SeccompEntry{}
	}
	changed := false // seccomp.img
	for _, f := range im.Seccomp.GetSeccompFilters() {
		if f.GetFlags()&seccompTsync != 0 {
			f.Flags, changed = proto.Uint32(f.GetFlags()&^seccompTsync), true
		}
	}
	// Each chain gets the host's filters in front, once.
	front := map[uint32]uint32{}
	stacked := map[uint32]uint32{} // thread: its first filter now
	tids := make([]uint32, 0, len(firsts))
	for tid := range firsts {
		tids = append(tids, tid)
	}
	slices.Sort(tids)
	for _, tid := range tids {
		first := firsts[tid]
		if im.holds(first, host) {
			// A chain restored here before holds the host's
			// filters already: they are not stacked again, so that
			// parks and resumes do not grow it.
			stacked[tid] = first
			continue
		}
		h, ok := front[first]
		if !ok {
			h = uint32(len(im.Seccomp.SeccompFilters))
			for i, f := range host {
				next := h + uint32(i) + 1
				if i == len(host)-1 {
					next = first
				}
				im.Seccomp.SeccompFilters = append(im.Seccomp.SeccompFilters,
					&seccomp.SeccompFilter{Filter: f.Insns, Prev: proto.Uint32(next), Flags: proto.Uint32(f.Flags &^ seccompTsync)})
			}
			front[first], changed = h, true
		}
		stacked[tid] = h
	}
	// Only what changes is written again.
	if changed {
		if err := rewriteImage(dir, "seccomp.img", seccompMagic, im.Seccomp); err != nil {
			return err
		}
	}
	for _, tid := range tids {
		th := im.Cores[tid].GetThreadCore()
		if th.GetSeccompMode() == criucore.SeccompMode_filter && th.SeccompFilter != nil && th.GetSeccompFilter() == stacked[tid] {
			continue
		}
		th.SeccompMode, th.SeccompFilter = criucore.SeccompMode_filter.Enum(), proto.Uint32(stacked[tid])
		if err := rewriteImage(dir, fmt.Sprintf("core-%d.img", tid), coreMagic, im.Cores[tid]); err != nil {
			return err
		}
	}
	return nil
}

// holds says whether the chain from filter first holds every filter of
// host, byte for byte (where in it does not matter: filters only narrow,
// and every one of a thread's is applied to each call).
func (im *Images) holds(first uint32, host []Filter) bool {
	fs := im.Seccomp.GetSeccompFilters()
	var chain [][]byte
	for i, more := first, true; more; { // walked by seccompChain: bounded
		chain = append(chain, fs[i].GetFilter())
		i, more = fs[i].GetPrev(), fs[i].Prev != nil
	}
	for _, h := range host {
		if !slices.ContainsFunc(chain, func(f []byte) bool { return bytes.Equal(f, h.Insns) }) {
			return false
		}
	}
	return true
}

// rewriteImage replaces image name in dir with its header (the magics)
// and the messages ms, as one entry each, keeping the file's owner and
// mode; a new image gets CRIU's common magic and magic.
func rewriteImage(dir, name string, magic uint32, ms ...proto.Message) error {
	p := filepath.Join(dir, name)
	head := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, imgCommon), magic)
	mode, uid, gid := os.FileMode(0o400), -1, -1
	if fi, err := os.Lstat(p); err == nil {
		mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
		if old, err := os.ReadFile(p); err == nil && len(old) >= 8 {
			head = old[:8]
		}
	}
	b := append([]byte(nil), head...)
	for _, m := range ms {
		e, err := proto.Marshal(m)
		if err != nil {
			return fmt.Errorf("criu: %s: %w", name, err)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	tmp := p + ".stack"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && uid >= 0 {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
