package executor

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestHostID: a sandbox's id as the host sees it, through its user
// namespace's maps (uid and gid apart), or as it is without one.
func TestHostID(t *testing.T) {
	l := &specs.Linux{
		UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1 << 20, Size: 65536}},
		GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 2 << 20, Size: 65536}},
	}
	for _, c := range []struct {
		l    *specs.Linux
		id   uint32
		gid  bool
		want uint32
	}{
		{nil, 1000, false, 1000},
		{&specs.Linux{}, 0, true, 0},
		{l, 0, false, 1 << 20},
		{l, 1000, false, 1<<20 + 1000},
		{l, 1000, true, 2<<20 + 1000},
		{l, 65535, false, 1<<20 + 65535},
	} {
		if got := hostID(c.l, c.id, c.gid); got != c.want {
			t.Errorf("hostID(%v, %d, gid %v) = %d, want %d", c.l, c.id, c.gid, got, c.want)
		}
	}
}
