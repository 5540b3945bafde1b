package manifest

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// host is a format-2 host: what a park here records over ImageKeys.
func testHost() Manifest {
	return Manifest{
		KernelRelease: "6.18.0", Arch: "amd64", CPUFlags: "avx avx2 fpu sse", CPUFeatures: record.Sum([]byte("avx avx2 fpu sse")).String(),
		CRIUImages: "criu-images/4.2", CRIUVersion: "4.2.1", RuncVersion: "1.5.3", ContainerdVersion: "v2.3.7",
		ImageDigest: "sha256:aa", UnitID: "b3:unit", Protocol: "runrecordd.unit/1",
	}
}

func with(m Manifest, kv ...string) Manifest {
	out := Manifest{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "<none>" {
			delete(out, kv[i])
			continue
		}
		out[kv[i]] = kv[i+1]
	}
	return out
}

func TestJudgeRules(t *testing.T) {
	rec, err := Over(ImageKeys, testHost())
	if err != nil {
		t.Fatal(err)
	}
	// A format-1 park of the same host: cpu.features the hash of the
	// flags, no cpu.flags, no criu.images.
	legacy := with(rec, CPUFeatures, testHost()[CPUFeatures], CPUFlags, "<none>", CRIUImages, "<none>", CRIUVersion, "4.2.0")
	for _, c := range []struct {
		name     string
		recorded Manifest
		host     Manifest
		fail     []string // keys that fail, sorted
		lacking  []string // cpu.features' lacking flags
	}{
		{name: "same host", recorded: rec, host: testHost()},
		// probe: patch levels of the restoring machinery
		{name: "kernel upgraded", recorded: rec, host: with(testHost(), KernelRelease, "6.19.2")},
		{name: "runc upgraded", recorded: rec, host: with(testHost(), RuncVersion, "1.6.0")},
		{name: "containerd upgraded", recorded: rec, host: with(testHost(), ContainerdVersion, "v2.3.9")},
		{name: "criu patch upgraded", recorded: rec, host: with(testHost(), CRIUVersion, "4.2.2")},
		{name: "all four upgraded", recorded: rec, host: with(testHost(), KernelRelease, "7.0", RuncVersion, "2", ContainerdVersion, "3", CRIUVersion, "4.2.9")},
		{name: "probe keys absent here", recorded: rec, host: with(testHost(), KernelRelease, "<none>", RuncVersion, "<none>")},
		// match: what the run's bytes depend on
		{name: "arch", recorded: rec, host: with(testHost(), Arch, "arm64"), fail: []string{Arch}},
		{name: "image digest", recorded: rec, host: with(testHost(), ImageDigest, "sha256:bb"), fail: []string{ImageDigest}},
		{name: "image absent", recorded: rec, host: with(testHost(), ImageDigest, "<none>"), fail: []string{ImageDigest}},
		{name: "unit id", recorded: rec, host: with(testHost(), UnitID, "b3:other"), fail: []string{UnitID}},
		{name: "criu image format", recorded: rec, host: with(testHost(), CRIUImages, "criu-images/4.3", CRIUVersion, "4.3.0"), fail: []string{CRIUImages}},
		{name: "protocol", recorded: Manifest{Arch: "amd64", ImageDigest: "sha256:aa", Protocol: "runrecordd.unit/1"},
			host: with(testHost(), Protocol, "runrecordd.unit/2"), fail: []string{Protocol}},
		{name: "unknown key", recorded: with(rec, "gpu.model", "x"), host: testHost(), fail: []string{"gpu.model"}},
		// flags: every recorded flag, more are fine
		{name: "cpu superset", recorded: rec, host: with(testHost(), CPUFlags, "avx avx2 avx512f fpu sse sse2")},
		{name: "cpu lacks flags", recorded: rec, host: with(testHost(), CPUFlags, "fpu sse"), fail: []string{CPUFlags}, lacking: []string{"avx", "avx2"}},
		{name: "cpu absent", recorded: rec, host: with(testHost(), CPUFlags, "<none>"), fail: []string{CPUFlags}},
		{name: "cpu empty list recorded", recorded: with(rec, CPUFlags, ""), host: with(testHost(), CPUFlags, "fpu")},
		{name: "cpu list unsorted", recorded: with(rec, CPUFlags, "sse fpu"), host: testHost(), fail: []string{CPUFlags}},
		{name: "cpu list repeated", recorded: with(rec, CPUFlags, "fpu fpu"), host: testHost(), fail: []string{CPUFlags}},
		{name: "cpu list double space", recorded: with(rec, CPUFlags, "avx  fpu"), host: testHost(), fail: []string{CPUFlags}},
		{name: "cpu list tab", recorded: with(rec, CPUFlags, "avx\tfpu"), host: testHost(), fail: []string{CPUFlags}},
		{name: "cpu hash as flags", recorded: with(rec, CPUFlags, legacy[CPUFeatures]), host: testHost(), fail: []string{CPUFlags}},
		// format 1: cpu hash by equality, criu.version by its format
		{name: "legacy same host", recorded: legacy, host: testHost()},
		{name: "legacy probe upgrades", recorded: legacy, host: with(testHost(), KernelRelease, "7.0", RuncVersion, "2", CRIUVersion, "4.2.5")},
		{name: "legacy cpu superset refused", recorded: legacy, host: with(testHost(), CPUFlags, "avx avx2 avx512f fpu sse",
			CPUFeatures, record.Sum([]byte("avx avx2 avx512f fpu sse")).String()), fail: []string{CPUFeatures}},
		{name: "legacy criu feature release", recorded: legacy, host: with(testHost(), CRIUImages, "criu-images/4.3"), fail: []string{CRIUVersion}},
		{name: "legacy host without criu", recorded: legacy, host: with(testHost(), CRIUImages, "<none>"), fail: []string{CRIUVersion}},
	} {
		t.Run(c.name, func(t *testing.T) {
			diffs := Judge(c.recorded, c.host)
			var keys []string
			for _, d := range diffs {
				keys = append(keys, d.Key)
				if d.String() == "" {
					t.Errorf("%s: empty message", d.Key)
				}
			}
			if !slices.Equal(keys, c.fail) {
				t.Fatalf("failing keys %v, want %v (%v)", keys, c.fail, diffs)
			}
			if c.lacking != nil && !slices.Equal(diffs[0].Lacking, c.lacking) {
				t.Fatalf("lacking %v, want %v", diffs[0].Lacking, c.lacking)
			}
		})
	}
}

func TestRuleOf(t *testing.T) {
	for _, c := range []struct {
		format int
		key    string
		want   Rule
	}{
		{Format2, Arch, Match}, {Format2, ImageDigest, Match}, {Format2, UnitID, Match}, {Format2, Protocol, Match},
		{Format2, CRIUImages, Match}, {Format2, CPUFlags, Flags}, {Format2, CPUFeatures, Match},
		{Format2, KernelRelease, Probe}, {Format2, RuncVersion, Probe}, {Format2, ContainerdVersion, Probe}, {Format2, CRIUVersion, Probe},
		{Format1, CPUFeatures, Match}, {Format1, CPUFlags, Flags}, {Format1, CRIUVersion, Format}, {Format1, KernelRelease, Probe},
		{Format2, "anything.else", Match},
	} {
		if got := RuleOf(c.format, c.key); got != c.want {
			t.Errorf("RuleOf(%d, %s) = %s, want %s", c.format, c.key, got, c.want)
		}
	}
}

func TestDifferenceQuotesLittle(t *testing.T) {
	long := strings.Repeat("x", 10000)
	for _, d := range Judge(Manifest{Arch: long, CRIUImages: "c", CPUFlags: strings.Repeat("a ", 100) + "b"}, Manifest{Arch: "amd64", CRIUImages: "c", CPUFlags: ""}) {
		if len(d.String()) > 400 {
			t.Errorf("%s: %d bytes", d.Key, len(d.String()))
		}
	}
	flags := make([]string, 40)
	for i := range flags {
		flags[i] = string(rune('a'+i/26)) + string(rune('a'+i%26))
	}
	d := Judge(Manifest{CRIUImages: "c", CPUFlags: strings.Join(flags, " ")}, Manifest{CRIUImages: "c", CPUFlags: "fpu"})
	if len(d) != 1 || len(d[0].Lacking) != 40 || !strings.Contains(d[0].String(), "and 24 more") {
		t.Fatalf("%v", d)
	}
}

func TestCRIUFormat(t *testing.T) {
	for v, want := range map[string]string{
		"4.2.1": "criu-images/4.2", "4.2.0": "criu-images/4.2", "4.3.0": "criu-images/4.3", "10.11.12": "criu-images/10.11",
		"unavailable": "criu-images/unavailable", "4": "criu-images/4", "4.x.1": "criu-images/4.x.1", "": "criu-images/",
	} {
		if got := CRIUFormat(v); got != want {
			t.Errorf("CRIUFormat(%q) = %q, want %q", v, got, want)
		}
	}
}

func TestFormats(t *testing.T) {
	// A transcript park's manifest names no key whose rule changed: it
	// stays format 1, readable by a host before the rules.
	tr := Manifest{Arch: "amd64", ImageDigest: "sha256:aa", Protocol: "runrecordd.unit/1"}
	b1, _ := tr.Canonical()
	if !strings.HasPrefix(string(b1), Domain+"1") || tr.Version() != Format1 {
		t.Fatalf("transcript manifest %q", b1[:22])
	}
	img, _ := Over(ImageKeys, testHost())
	b2, _ := img.Canonical()
	if !strings.HasPrefix(string(b2), Domain+"2") || img.Version() != Format2 {
		t.Fatalf("image manifest %q", b2[:22])
	}
	back, err := Decode(b2)
	if err != nil || back[CRIUImages] != "criu-images/4.2" {
		t.Fatalf("decode: %v %v", back, err)
	}
	// The format digit must be the one the keys give.
	wrong := append([]byte(nil), b2...)
	wrong[len(Domain)] = '1'
	if _, err := Decode(wrong); !errors.Is(err, ErrMalformed) || errors.Is(err, ErrFormat) {
		t.Fatalf("format 1 naming criu.images: %v", err)
	}
	// A newer runrecordd's format is refused as one, not misread.
	for _, d := range []byte{'3', '9', 'x', 0} {
		newer := append([]byte(nil), b2...)
		newer[len(Domain)] = d
		if _, err := Decode(newer); !errors.Is(err, ErrFormat) || !errors.Is(err, ErrMalformed) {
			t.Fatalf("format %q: %v", d, err)
		}
	}
	// Required keys follow the format: a format-1 image park lacks
	// criu.images and is whole; a format-2 one must name it.
	legacy := with(img, CRIUImages, "<none>", CPUFlags, "<none>", CPUFeatures, "b3:x")
	if miss := legacy.Missing(legacy.Required(false)); miss != nil {
		t.Fatalf("format 1 lacks %v", miss)
	}
	if miss := img.Missing(img.Required(false)); miss != nil {
		t.Fatalf("format 2 lacks %v", miss)
	}
	bare := Manifest{CRIUImages: "criu-images/4.2", Arch: "amd64"}
	if miss := bare.Missing(bare.Required(false)); len(miss) != 7 {
		t.Fatalf("bare format 2 lacks %v", miss)
	}
}
