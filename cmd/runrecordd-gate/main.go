// Command runrecordd-gate is the first process of a warm sandbox
// (docs/warm-pool.md): started ahead of a resume in the unit's container,
// with the unit's user, limits and filters, it waits for the daemon's
// word on a FIFO and then replaces itself (execve, keeping pid 1) with the
// unit's process. A resume that takes the sandbox then writes one byte
// instead of running `runc start`, the container's task already started.
// It must be linked statically: it runs in the unit's image.
//
// Usage: runrecordd-gate FIFO ARG0 [ARG...]
//
// ARG0 is looked up on the sandbox's PATH before the wait, as runc looks
// up a process's first argument. The word is the byte 'g'; another byte,
// or the FIFO's end without one, ends the gate with status 125, and
// nothing of the unit runs. (A sandbox discarded is killed, gate and all.)
package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// exitNoWord is the gate's status when the daemon ended the FIFO without
// its word, or the gate could not wait for it; exitNoExec, when the
// unit's process could not be started.
const (
	exitNoWord = 125
	exitNoExec = 127
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: runrecordd-gate FIFO ARG0 [ARG...]")
		os.Exit(exitNoWord)
	}
	// Looked up before the wait, as runc looks it up before waiting on
	// its exec FIFO: an argv that cannot run ends the gate at once, and
	// the resume finds the sandbox gone and starts one as without it.
	args := os.Args[2:]
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "runrecordd-gate: %s: %v\n", args[0], err)
		os.Exit(exitNoExec)
	}
	if !wait(os.Args[1]) {
		os.Exit(exitNoWord)
	}
	err = syscall.Exec(path, args, os.Environ())
	fmt.Fprintf(os.Stderr, "runrecordd-gate: %s: %v\n", args[0], err)
	os.Exit(exitNoExec)
}

// wait blocks until the daemon writes its word on fifo, or ends it.
func wait(fifo string) bool {
	f, err := os.Open(fifo) // blocks until the daemon opens it to write
	if err != nil {
		fmt.Fprintf(os.Stderr, "runrecordd-gate: %v\n", err)
		return false
	}
	defer f.Close()
	var b [1]byte
	n, _ := f.Read(b[:])
	return n == 1 && b[0] == 'g'
}
