package daemon

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// An image run parked under one kernel, runc, containerd and CRIU patch
// level resumes here under others: the probe judges those. Under a CPU
// lacking one of the recorded flags, or a CRIU of another feature release
// (another image format), the resume is refused naming the keys, nothing
// changes, and it resumes once this host satisfies the manifest again.
func TestResumeAcrossUpgrades(t *testing.T) {
	h := newFakeHost(t)
	facts := h.d.host
	flags := strings.Split(facts[manifest.CPUFlags], " ")
	if len(flags) < 2 {
		t.Fatalf("cpu features %q: too few flags for the test", facts[manifest.CPUFlags])
	}
	fewer := strings.Join(flags[1:], " ")
	more := append(slices.Clone(flags), "zz_newer_cpu")
	slices.Sort(more)
	criu := func(v string) []string {
		return []string{manifest.CRIUVersion, v, manifest.CRIUImages, manifest.CRIUFormat(v)}
	}
	h.start(t, "r")
	for _, c := range []struct {
		name    string
		changed []string // key, value, …
		fail    []string
	}{
		{"kernel, runc, containerd and criu patch upgraded", append([]string{manifest.KernelRelease, "7.0.1-upgraded",
			manifest.RuncVersion, "1.5.9", manifest.ContainerdVersion, "v2.3.99"}, criu("4.2.7")...), nil},
		{"a newer cpu", []string{manifest.CPUFlags, strings.Join(more, " ")}, nil},
		{"a cpu lacking a recorded flag", []string{manifest.CPUFlags, fewer}, []string{manifest.CPUFlags}},
		{"a criu feature release", criu("4.3.0"), []string{manifest.CRIUImages}},
		{"both", append([]string{manifest.CPUFlags, fewer, manifest.KernelRelease, "7.0.1"}, criu("5.0.0")...),
			[]string{manifest.CPUFlags, manifest.CRIUImages}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := h.d.Park(t.Context(), "r"); err != nil {
				t.Fatal(err)
			}
			h.teardown(t, "r")
			parked := h.kinds(t, "r")
			upgraded := maps.Clone(facts)
			for i := 0; i < len(c.changed); i += 2 {
				upgraded[c.changed[i]] = c.changed[i+1]
			}
			h.d.forms.Facts = upgraded
			defer func() { h.d.forms.Facts = facts }()
			_, err := h.d.Resume(t.Context(), "r", nil)
			if c.fail == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var me *resume.ManifestError
			if !errors.As(err, &me) || !slices.Equal(me.Keys(), c.fail) {
				t.Fatalf("resume: %v, want manifest_mismatch naming %v", err, c.fail)
			}
			if got := h.kinds(t, "r"); got != parked {
				t.Fatalf("segments %s after the refusal, were %s", got, parked)
			}
			if st, _ := h.d.st.Run("r"); st.Phase != record.PhaseParked {
				t.Fatalf("phase %s after the refusal", st.Phase)
			}
			h.d.forms.Facts = facts
			if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
				t.Fatalf("resume on the host as parked: %v", err)
			}
		})
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
}
