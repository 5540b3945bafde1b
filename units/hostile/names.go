package main

import (
	"os"
	"time"
)

// The names attacks run in a sandbox granted egress to a name
// (test/e2e/egress_names_test.go).
func init() {
	// "egress-dial-loop" fetches HOSTILE_ADDR (name:port), resolving the
	// name again each time (Go's resolver keeps no cache), every 500 ms,
	// saying "ok FIRST-LINE" or "refused ERR" each time; it never ends.
	attacks["egress-dial-loop"] = func() {
		for {
			say("%s", fetch(os.Getenv("HOSTILE_ADDR")))
			time.Sleep(500 * time.Millisecond)
		}
	}
}
