// Command hostile is the attack suite's unit: one program that does, inside
// its sandbox, whatever a hostile unit could (test/e2e/attack_*_test.go).
// HOSTILE names the attack; each attack lives in the file of its area and
// registers itself in attacks from an init function. Every attack prints
// "hostile: NAME: ..." lines on stdout as it goes, so a test can wait for
// a step, and then idles until it is killed, so the test decides when the
// run ends.
package main

import (
	"fmt"
	"os"
	"sort"
	"time"
)

// attacks maps a HOSTILE value to the attack it runs.
var attacks = map[string]func(){}

func main() {
	name := os.Getenv("HOSTILE")
	a, ok := attacks[name]
	if !ok {
		var names []string
		for n := range attacks {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Printf("hostile: unknown attack %q (known: %v)\n", name, names)
		os.Exit(2)
	}
	a()
	idle()
}

// say prints one progress line of the attack.
func say(format string, args ...any) {
	fmt.Printf("hostile: "+os.Getenv("HOSTILE")+": "+format+"\n", args...)
}

// idle keeps the unit alive, doing nothing, until it is killed.
func idle() {
	for {
		time.Sleep(time.Hour)
	}
}

func init() {
	// "idle" does nothing: a unit that only has to exist.
	attacks["idle"] = func() { say("idling") }
}
