// Command etcdmember runs one member of an etcdtest cluster in a process
// of its own (etcdtest.Spawn starts it; etcdtest.Serve is its body): it
// prints "ready" once the member serves, and stops the member when its
// standard input ends.
package main

import (
	"fmt"
	"os"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
)

func main() {
	if err := etcdtest.Serve(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "etcdmember:", err)
		os.Exit(1)
	}
}
