package executor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Every sandbox runs in a network namespace the executor makes itself and
// pins at a path (StateDir/netns/<id>), rather than one runc makes. Three
// things follow:
//
//   - The namespace is configured before the unit's first instruction:
//     loopback up or down as the grant says, and MPTCP off. Go programs
//     since 1.24 listen with MPTCP where the kernel offers it, and CRIU
//     cannot dump an MPTCP socket ("Unsupported proto 262"); with
//     net.mptcp.enabled=0 the same listen gets plain TCP.
//   - runc dumps a namespace given by path as external and, on restore,
//     rejoins the path of the new sandbox's spec. So a restore runs in a
//     fresh namespace configured the same way, here or on another host,
//     and CRIU restores the unit's sockets into it (listeners, and
//     established connections through TCP repair). CRIU's own dump of a
//     runc-made namespace keeps nothing of it on this kernel: no links,
//     so a restored sandbox came back with loopback down and its servers
//     unreachable.
//   - Nothing of the namespace has to be dumped or restored (links,
//     addresses, routes, iptables and nftables rulesets), which CRIU does
//     by running ip and iptables-save/restore.
//
// The namespace lives as long as its pin: [removeNetns] unmounts it.

// netnsPath is where sandbox id's network namespace is pinned.
func (c *Client) netnsPath(id string) string {
	return filepath.Join(c.cfg.StateDir, "netns", id)
}

// makeNetns makes a network namespace pinned at path, with loopback up
// when loopback is set (down otherwise) and MPTCP disabled. path must not
// exist. On error nothing is left at path.
//
// The work happens on a goroutine locked to its OS thread, which unshares
// its network namespace and then returns to the one it had; if it cannot
// return, the goroutine exits still locked and the runtime discards the
// thread rather than let other goroutines run in the new namespace.
func makeNetns(path string, loopback bool) (retErr error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o400)
	if err != nil {
		return fmt.Errorf("network namespace pin: %w", err)
	}
	f.Close()
	defer func() {
		if retErr != nil {
			_ = unix.Unmount(path, unix.MNT_DETACH)
			os.Remove(path)
		}
	}()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(own)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		err = configureNetns(loopback)
		if err == nil {
			err = unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
			if err != nil {
				err = fmt.Errorf("pin network namespace at %s: %w", path, err)
			}
		}
		if serr := unix.Setns(own, unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- errors.Join(err, fmt.Errorf("return to own network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// configureNetns sets up the calling thread's (new) network namespace.
func configureNetns(loopback bool) error {
	// /proc/sys/net shows the namespace of the thread that opens it. A
	// kernel without MPTCP has no such file, and nothing to turn off.
	if err := os.WriteFile("/proc/sys/net/mptcp/enabled", []byte("0\n"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disable MPTCP: %w", err)
	}
	if loopback {
		return setLink("lo", true)
	}
	return nil
}

// removeNetns unpins and removes a namespace made by makeNetns. A path that
// is absent is not an error.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpin network namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// setLink sets or clears IFF_UP on the interface name in the calling
// thread's network namespace.
func setLink(name string, up bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("flags of %s: %w", name, err)
	}
	flags := ifr.Uint16() &^ unix.IFF_UP
	if up {
		flags |= unix.IFF_UP
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set %s up=%v: %w", name, up, err)
	}
	return nil
}

// unlockNetns clears what a CRIU killed in the middle of a dump may have
// left of its network lock in sandbox id's namespace. CRIU locks the
// network of the tree it dumps with a table of nftables rules that drop
// its packets (criuConfig's network-lock; iptables rules in parks of
// executors before it), and removes it when it is done; killed, it leaves
// it, and the unit's connections stay cut. A unit cannot add rules of its
// own (containerd's default capabilities leave out CAP_NET_ADMIN), so
// every rule in the namespace is CRIU's: the whole nftables ruleset is
// flushed, and the iptables filter tables are reset to empty. The
// namespace is the executor's pin, or, in a sandbox with a user namespace
// (runc made the network namespace: no pin), the one of the unit's init,
// host pid unit.
func (c *Client) unlockNetns(id string, unit int) error {
	const empty = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
	ns := c.netnsPath(id)
	if _, err := os.Lstat(ns); errors.Is(err, os.ErrNotExist) && unit > 0 {
		ns = "/proc/" + strconv.Itoa(unit) + "/ns/net"
	}
	var errs []error
	for _, tool := range [][]string{{"nft", "flush", "ruleset"}, {"iptables-restore"}, {"ip6tables-restore"}} {
		cmd := exec.Command("nsenter", append([]string{"--net=" + ns}, tool...)...)
		if tool[0] != "nft" {
			cmd.Stdin = strings.NewReader(empty)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s in the network namespace of %s: %v: %s", tool[0], id, err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}

// releaseCRIU clears what a CRIU killed in the middle of a dump may have
// left in sandbox id, whose unit's init is the host pid unit: its network
// lock (unlockNetns) and TCP repair mode on the connections it had begun
// to dump. A socket in repair mode refuses the unit's reads and writes
// (EPERM), so a connection CRIU froze would stay dead though the unit runs.
func (c *Client) releaseCRIU(id string, unit int) error {
	return errors.Join(c.unlockNetns(id, unit), repairOff(unit))
}

// repairOff takes every TCP socket of the process tree rooted at the host
// pid root out of repair mode. It reaches the sockets through pidfd_getfd,
// so nothing the unit names (paths, links) is followed.
func repairOff(root int) error {
	procs, err := processes()
	if err != nil {
		return err
	}
	children := childrenOf(procs)
	tree := []int{root}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	seen := map[uint64]bool{}
	var errs []error
	for _, pid := range tree {
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, e := range fds {
			n, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, n)); err != nil || !strings.HasPrefix(l, "socket:") {
				continue
			}
			fd, err := unix.PidfdGetfd(pidfd, n, 0)
			if err != nil {
				continue
			}
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && !seen[st.Ino] {
				seen[st.Ino] = true
				// Not a TCP socket: the option is not there.
				if on, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR); err == nil && on != 0 {
					if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_OFF); err != nil {
						errs = append(errs, fmt.Errorf("take socket %d of pid %d out of repair mode: %w", n, pid, err))
					}
				}
			}
			unix.Close(fd)
		}
		unix.Close(pidfd)
	}
	return errors.Join(errs...)
}
