package executor

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// loopbackDown takes the loopback interface down in the network namespace
// of process pid. runc brings lo up in every new network namespace; a
// sandbox granted no network gets it down, before its process starts, so
// that not even 127.0.0.1 answers.
//
// The work happens on a goroutine locked to its OS thread, which enters the
// namespace and returns to its own; if it cannot return, the goroutine
// exits still locked and the runtime discards the thread rather than let
// other goroutines run in the sandbox's namespace.
func loopbackDown(pid uint32) error {
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
		target, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns of %d: %w", pid, err)
			return
		}
		err = linkDown("lo")
		if serr := unix.Setns(own, unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- fmt.Errorf("leave netns of %d: %w", pid, serr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// linkDown clears IFF_UP on the interface name in the calling thread's
// network namespace.
func linkDown(name string) error {
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
	ifr.SetUint16(ifr.Uint16() &^ unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("take %s down: %w", name, err)
	}
	return nil
}
