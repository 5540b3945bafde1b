package main

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// errTerminal is a verb refusing to write a bundle to a terminal (exit 2):
// hundreds of MB of tar would scroll by, and the run would be handed off
// to nothing.
var errTerminal = errors.New("refusing to write a bundle to a terminal: give -f FILE, or redirect standard output")

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
