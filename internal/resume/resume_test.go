package resume

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func addr(s string) record.Address { return record.Sum([]byte(s)) }

// parked returns the inputs of a parked run recorded under manifest m.
func parked(t *testing.T, m manifest.Manifest) (Inputs, record.Snapshot) {
	t.Helper()
	ma, err := m.Address()
	if err != nil {
		t.Fatal(err)
	}
	mem := addr("memory")
	snap := record.ImageSnapshot(addr("root"), &mem)
	r := record.New(addr("unit"), addr("grants"))
	in := Inputs{Unit: r.Unit(), Grants: r.Grants(), Offered: snap, RecordedManifest: m, Host: host}
	for _, s := range []record.Segment{record.Execution(addr("att"), nil), record.Suspension(snap, ma)} {
		h, err := r.Append(s)
		if err != nil {
			t.Fatal(err)
		}
		in.Segments = append(in.Segments, s)
		in.Heads = append(in.Heads, h)
	}
	return in, snap
}

var host = manifest.Manifest{manifest.KernelRelease: "6.18.0", manifest.Arch: "amd64", manifest.CRIUVersion: "4.1.1", "other": "ignored",
	manifest.CRIUImages: "criu-images/4.1", manifest.CPUFlags: "f", manifest.CPUFeatures: record.Sum([]byte("f")).String(), manifest.RuncVersion: "1.3", manifest.ContainerdVersion: "2.1", manifest.ImageDigest: "sha256:x", manifest.UnitID: "u"}

// full is this host's image-park manifest with some values changed.
func full(changed manifest.Manifest) manifest.Manifest {
	m, _ := manifest.Over(manifest.ImageKeys, host)
	for k, v := range changed {
		m[k] = v
	}
	return m
}

func TestCheckPasses(t *testing.T) {
	in, _ := parked(t, full(nil))
	if err := Check(in); err != nil {
		t.Fatal(err)
	}
}

func TestCheckOrderAndTypes(t *testing.T) {
	in, _ := parked(t, full(manifest.Manifest{manifest.CRIUImages: "criu-images/4.0"}))
	in.Segments[0].Attestation = addr("edited") // precondition 3 fails too
	good := in
	flipped := addr("memory, one byte flipped")
	in.Offered = record.ImageSnapshot(addr("root"), &flipped)

	// Snapshot first, though the manifest and the record are wrong too.
	err := Check(in)
	var se *SnapshotError
	if !errors.As(err, &se) || !errors.Is(err, record.ErrSnapshotMismatch) {
		t.Fatalf("want snapshot error, got %v", err)
	}
	// A transcript offered for an image over the same address is a mismatch.
	in.Offered = record.TranscriptSnapshot(addr("root"))
	if err := Check(in); !errors.As(err, &se) {
		t.Fatalf("form swap: %v", err)
	}
	// Then the manifest, naming the key.
	err = Check(good)
	var me *ManifestError
	if !errors.As(err, &me) || strings.Join(me.Keys(), ",") != manifest.CRIUImages || !strings.Contains(err.Error(), `recorded "criu-images/4.0", this host "criu-images/4.1"`) {
		t.Fatalf("want manifest error naming criu.images, got %v", err)
	}
}

// The precondition is the recorded manifest's rules, not its address:
// a park under other patch levels of the kernel and runtime resumes,
// one under other CPU flags or another image format does not, naming
// the keys; a format-1 manifest is judged by format 1's rules.
func TestCheckJudgesByRule(t *testing.T) {
	for _, c := range []struct {
		name    string
		changed manifest.Manifest
		fail    []string
	}{
		{"probe keys differ", manifest.Manifest{manifest.KernelRelease: "6.12.0", manifest.RuncVersion: "1.1.5",
			manifest.ContainerdVersion: "1.6.20", manifest.CRIUVersion: "4.1.0"}, nil},
		{"fewer cpu flags recorded", manifest.Manifest{manifest.CPUFlags: ""}, nil},
		{"cpu flag lacking here", manifest.Manifest{manifest.CPUFlags: "avx512f f"}, []string{manifest.CPUFlags}},
		{"image format and cpu", manifest.Manifest{manifest.CPUFlags: "g", manifest.CRIUImages: "criu-images/4.2",
			manifest.KernelRelease: "7.0"}, []string{manifest.CPUFlags, manifest.CRIUImages}},
		{"format 1, same host", manifest.Manifest{manifest.CRIUImages: "", manifest.CPUFlags: "", manifest.CPUFeatures: record.Sum([]byte("f")).String(),
			manifest.KernelRelease: "6.1.0", manifest.CRIUVersion: "4.1.0"}, nil},
		{"format 1, criu feature release", manifest.Manifest{manifest.CRIUImages: "", manifest.CPUFlags: "", manifest.CPUFeatures: record.Sum([]byte("f")).String(),
			manifest.CRIUVersion: "4.0.0"}, []string{manifest.CRIUVersion}},
		{"format 1, cpu hash", manifest.Manifest{manifest.CRIUImages: "", manifest.CPUFlags: "", manifest.CPUFeatures: record.Sum([]byte("")).String()},
			[]string{manifest.CPUFeatures}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := full(c.changed)
			if v, ok := c.changed[manifest.CRIUImages]; ok && v == "" { // format 1
				delete(m, manifest.CRIUImages)
				delete(m, manifest.CPUFlags)
			}
			in, _ := parked(t, m)
			err := Check(in)
			var me *ManifestError
			switch {
			case c.fail == nil && err != nil:
				t.Fatal(err)
			case c.fail != nil && (!errors.As(err, &me) || !slices.Equal(me.Keys(), c.fail)):
				t.Fatalf("want keys %v, got %v", c.fail, err)
			}
		})
	}
}

// A manifest without the keys its park form requires would match any
// host: refused, naming them.
func TestCheckRefusesIncompleteManifest(t *testing.T) {
	for _, m := range []manifest.Manifest{{}, {manifest.Arch: "amd64", manifest.KernelRelease: "6.18.0"}} {
		in, _ := parked(t, m)
		var me *ManifestError
		if err := Check(in); !errors.As(err, &me) || !slices.Contains(me.Keys(), manifest.UnitID) || !strings.Contains(err.Error(), "lacks keys") {
			t.Fatalf("manifest %v: %v", m, err)
		}
	}
}

func TestCheckRecord(t *testing.T) {
	in, _ := parked(t, full(nil))
	in.Segments[0].Attestation = addr("edited")
	err := Check(in)
	var re *RecordError
	var seg *record.SegmentError
	if !errors.As(err, &re) || !errors.As(err, &seg) || seg.Index != 0 || !errors.Is(err, record.ErrHeadMismatch) {
		t.Fatalf("want record error at segment 0, got %v", err)
	}
}

func TestCheckRefusesOthers(t *testing.T) {
	in, _ := parked(t, full(nil))
	notParked := in
	notParked.Segments = in.Segments[:1]
	if err := Check(notParked); !errors.Is(err, ErrNotParked) {
		t.Fatal(err)
	}
	in.RecordedManifest = full(manifest.Manifest{manifest.Arch: "arm64"})
	if err := Check(in); err == nil || !strings.Contains(err.Error(), "store is damaged") {
		t.Fatal(err)
	}
}
