// Command fleetdemo runs a 3-member etcd cluster on loopback for
// deploy/fleet-demo.sh (internal/etcdtest, etcd's embed package): it
// prints the client endpoints, comma-separated, on its first line, and
// serves until SIGTERM or SIGINT. It is a demo's cluster, not a
// production one: its data lives under a directory it removes at exit.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
)

func main() {
	root, err := os.MkdirTemp("", "fleetdemo-etcd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetdemo:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(root)
	n := 0
	c, err := etcdtest.Run(func() string {
		n++
		d := filepath.Join(root, "m"+strconv.Itoa(n))
		_ = os.MkdirAll(d, 0o700)
		return d
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetdemo: etcd:", err)
		os.Exit(1)
	}
	defer c.Close()
	fmt.Println(strings.Join(c.Endpoints(), ","))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
