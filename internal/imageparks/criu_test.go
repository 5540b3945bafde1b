package imageparks

import (
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// fakeBuild is a CRIU build that can do what it lists.
type fakeBuild []criu.Capability

func (b fakeBuild) Has(c criu.Capability) bool { return slices.Contains(b, c) }
func (b fakeBuild) Lacks(c criu.Capability) string {
	if b.Has(c) {
		return ""
	}
	return "lacks " + criu.Patch(c)
}

func TestCheckBuild(t *testing.T) {
	both := []criu.Capability{criu.TmpfsDump, criu.TmpfsRestore}
	cases := []struct {
		name  string
		seen  []criu.Capability
		build fakeBuild
		want  []string // one substring per note, in order
	}{
		{"patched and seen", both, both, []string{"tmpfs-dump: CRIU does it in its own process (deploy/criu/4-", "tmpfs-restore: CRIU does it in its own process (deploy/criu/3-"}},
		{"unpatched", nil, nil, []string{"tmpfs-dump: off, CRIU forks tar and gzip for each tmpfs: lacks 4-", "tmpfs-restore: off, CRIU forks tar and gzip for each tmpfs: lacks 3-"}},
		{"recorded, not seen", nil, both, []string{"the build carries deploy/criu/4-tmpfs-small-dump.patch but the probe's CRIU forked tar", "carries deploy/criu/3-"}},
		{"seen, not recorded", both[:1], nil, []string{"tmpfs-dump: seen at work, though", "tmpfs-restore: off"}},
	}
	for _, tc := range cases {
		p := CheckBuild(criu.Probe{OK: true, Notes: []string{"first"}, Seen: tc.seen}, tc.build)
		if len(p.Notes) != 1+len(tc.want) || p.Notes[0] != "first" {
			t.Errorf("%s: notes %q", tc.name, p.Notes)
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(p.Notes[1+i], w) {
				t.Errorf("%s: note %d %q, want it to hold %q", tc.name, i, p.Notes[1+i], w)
			}
		}
	}
	if p := CheckBuild(criu.Probe{Reason: "no"}, fakeBuild(nil)); len(p.Notes) != 0 {
		t.Errorf("a failed probe got notes %q", p.Notes)
	}
}

// TestUserNS: a probe whose dump and restore in a user namespace passed
// runs image units in them; failed, it closes the gate unless the host
// accepts host-root image units; a probe that did not try is left alone.
func TestUserNS(t *testing.T) {
	passed := criu.Probe{OK: true, UserNSTried: true, UserNS: true}
	failed := criu.Probe{OK: true, UserNSTried: true, UserNSReason: "runc said no"}
	if p := UserNS(passed, false); !p.OK || len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "run in user namespaces") {
		t.Errorf("passed: %+v", p)
	}
	if p := UserNS(failed, false); p.OK || !strings.Contains(p.Reason, "--allow-host-root-images") || !strings.Contains(p.Reason, "runc said no") {
		t.Errorf("failed, host root not accepted: %+v", p)
	}
	if p := UserNS(failed, true); !p.OK || len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "as the host's root") || !strings.Contains(p.Notes[0], "runc said no") {
		t.Errorf("failed, host root accepted: %+v", p)
	}
	if p := UserNS(criu.Probe{OK: true}, false); !p.OK || len(p.Notes) != 0 {
		t.Errorf("not tried: %+v", p)
	}
	if p := UserNS(criu.Probe{Reason: "no CRIU", UserNSTried: true}, false); p.OK || p.Reason != "no CRIU" {
		t.Errorf("a failed probe: %+v", p)
	}
}
