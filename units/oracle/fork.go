package main

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// forkOnUSR2, with FORK_ON_USR2=1 set, makes each SIGUSR2 fork a process
// without exec: a copy of the oracle's memory, the buffer with it, as a
// unit that forks inside a lazy restore's window makes one. The copy
// reads nothing, runs no Go code (one thread of a Go runtime cannot) and
// pauses until it is killed; a test reads its memory through /proc, at
// buf's address, which it returns (0 without FORK_ON_USR2=1).
func forkOnUSR2(buf []byte) uint64 {
	if os.Getenv("FORK_ON_USR2") != "1" {
		return 0
	}
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	go func() {
		for range usr2 {
			forkPause()
		}
	}()
	return uint64(uintptr(unsafe.Pointer(&buf[0])))
}

// forkPause forks; the child pauses for ever.
func forkPause() {
	pid, _, errno := syscall.RawSyscall(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0)
	if errno == 0 && pid == 0 {
		for {
			_, _, _ = syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
		}
	}
}
