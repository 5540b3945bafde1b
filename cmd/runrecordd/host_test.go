package main

import (
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// TestUserNamespacesLine: `runrecordd host` says whether units run in user
// namespaces, and how image units run, and why, in each case.
func TestUserNamespacesLine(t *testing.T) {
	for _, c := range []struct {
		h    api.Host
		want string
	}{
		{api.Host{HostRootImages: true}, "off: every unit runs as the host's root"},
		{api.Host{UserNamespaces: true, ImageParks: api.ImageParks{Status: "available", UserNamespaces: true}}, "image units too (a dump and restore in a user namespace passed)"},
		{api.Host{UserNamespaces: true, ImageParks: api.ImageParks{Status: "probing"}}, "image units wait for the probe"},
		{api.Host{UserNamespaces: true, HostRootImages: true, ImageParks: api.ImageParks{Status: "available"}}, "image units run as the host's root (--allow-host-root-images)"},
		{api.Host{UserNamespaces: true, HostRootImages: true, ImageParks: api.ImageParks{Status: "unavailable"}}, "image parks are unavailable"},
		{api.Host{UserNamespaces: true, ImageParks: api.ImageParks{Status: "unavailable"}}, "image units are refused"},
	} {
		if got := userNamespaces(c.h); !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want it to say %q", c.h, got, c.want)
		}
	}
}
