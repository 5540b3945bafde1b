package main

import (
	"testing"
)

// The stop policy: --on-stop as given, park otherwise, whether or not
// systemd started the daemon (NOTIFY_SOCKET or INVOCATION_ID set).
func TestOnStopPolicy(t *testing.T) {
	for _, c := range []struct {
		flag, socket, invocation, want string
	}{
		{"", "", "", onStopPark},
		{"", "/run/systemd/notify", "", onStopPark},
		{"", "", "0123abcd", onStopPark},
		{onStopLeave, "/run/systemd/notify", "0123abcd", onStopLeave},
		{onStopPark, "", "", onStopPark},
	} {
		t.Setenv("NOTIFY_SOCKET", c.socket)
		t.Setenv("INVOCATION_ID", c.invocation)
		if got := onStopPolicy(c.flag); got != c.want {
			t.Errorf("--on-stop=%q, NOTIFY_SOCKET=%q, INVOCATION_ID=%q: %s, want %s", c.flag, c.socket, c.invocation, got, c.want)
		}
	}
}
