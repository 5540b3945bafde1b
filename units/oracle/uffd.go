package main

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
)

// uffdRefSignals, with UFFD_REF_ON_USR2 set to "epoll" or "dup", is where
// each SIGUSR2 arrives (nil otherwise): the loop then toggles a reference
// of the oracle's own to every userfaultfd it holds (toggleUffdRefs), as
// a unit that waits on, or copies, the userfaultfd a lazy restore left it.
func uffdRefSignals() <-chan os.Signal {
	if k := os.Getenv("UFFD_REF_ON_USR2"); k != "epoll" && k != "dup" {
		return nil
	}
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	return usr2
}

// toggleUffdRefs makes the references UFFD_REF_ON_USR2 names, or closes
// the ones it made, and says so in the line ("uffd_toggles" toggles,
// "uffd_refs" userfaultfds referred to now): an epoll listing every
// userfaultfd the process holds ("epoll"), or a second descriptor of each
// ("dup"). The descriptors stay raw: a pollable os.File would put them in
// the Go runtime's own epoll.
func (o *oracle) toggleUffdRefs() error {
	o.line.UffdToggles++
	if len(o.uffdRefs) > 0 {
		for _, fd := range o.uffdRefs {
			if err := syscall.Close(fd); err != nil {
				return o.fail("close fd %d referring to a userfaultfd: %v", fd, err)
			}
		}
		o.uffdRefs, o.line.UffdRefs = nil, 0
		return nil
	}
	fds := uffds()
	if os.Getenv("UFFD_REF_ON_USR2") == "dup" {
		for _, fd := range fds {
			d, err := syscall.Dup(fd)
			if err != nil {
				return o.fail("dup userfaultfd %d: %v", fd, err)
			}
			syscall.CloseOnExec(d)
			o.uffdRefs = append(o.uffdRefs, d)
		}
		o.line.UffdRefs = len(fds)
		return nil
	}
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return o.fail("epoll_create1: %v", err)
	}
	o.uffdRefs = []int{epfd}
	for _, fd := range fds {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
		if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return o.fail("epoll_ctl add userfaultfd %d: %v", fd, err)
		}
	}
	o.line.UffdRefs = len(fds)
	return nil
}

// uffds are the descriptors of the process that are userfaultfds.
func uffds() []int {
	ents, _ := os.ReadDir("/proc/self/fd")
	var fds []int
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); l == "anon_inode:[userfaultfd]" {
			fds = append(fds, fd)
		}
	}
	return fds
}
