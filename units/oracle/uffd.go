package main

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
)

// uffdEpollSignals, with EPOLL_UFFD_ON_USR2=1 set, is where each SIGUSR2
// arrives (nil otherwise): the loop then toggles an epoll of the oracle's
// own that lists every userfaultfd it holds (toggleUffdEpoll), as a unit
// that waits on the userfaultfd a lazy restore left it does.
func uffdEpollSignals() <-chan os.Signal {
	if os.Getenv("EPOLL_UFFD_ON_USR2") != "1" {
		return nil
	}
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	return usr2
}

// toggleUffdEpoll makes an epoll listing every userfaultfd the process
// holds, or closes the one it made, and says so in the line
// ("uffd_epolls" toggles, "uffd_epolled" userfaultfds listed now). The
// descriptors stay raw: a pollable os.File would put them in the Go
// runtime's own epoll.
func (o *oracle) toggleUffdEpoll() error {
	o.line.UffdEpolls++
	if o.uffdEpoll >= 0 {
		err := syscall.Close(o.uffdEpoll)
		o.uffdEpoll, o.line.UffdEpolled = -1, 0
		if err != nil {
			return o.fail("close the userfaultfds' epoll: %v", err)
		}
		return nil
	}
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return o.fail("epoll_create1: %v", err)
	}
	o.uffdEpoll = epfd
	for _, fd := range uffds() {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
		if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return o.fail("epoll_ctl add userfaultfd %d: %v", fd, err)
		}
		o.line.UffdEpolled++
	}
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
