package manifest

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestCanonicalPinned(t *testing.T) {
	m := Manifest{"b": "2", "a": "xy"}
	got, err := m.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte("runrecordd.manifest/1"), mustHex(t, "00000002 00000001 61 00000002 7879 00000001 62 00000001 32")...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %x\nwant %x", got, want)
	}
	back, err := Decode(got)
	if err != nil || len(back) != 2 || back["a"] != "xy" {
		t.Fatalf("decode: %v %v", back, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := Manifest{"a": "1", "b": "2"}.Canonical()
	swapped := append([]byte("runrecordd.manifest/1"), mustHex(t, "00000002 00000001 62 00000001 32 00000001 61 00000001 31")...)
	for name, b := range map[string][]byte{
		"empty":     nil,
		"header":    []byte("runrecordd.manifest/2\x00\x00\x00\x00"),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"unsorted":  swapped,
		"huge len":  append([]byte("runrecordd.manifest/1"), mustHex(t, "00000001 ffffffff")...),
	} {
		if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestOver(t *testing.T) {
	host := Manifest{KernelRelease: "6.18.0", Arch: "amd64", CRIUVersion: "4.1.1", "extra": "x"}
	rec, err := Over([]string{KernelRelease, Arch, CRIUVersion}, host)
	if err != nil {
		t.Fatal(err)
	}
	a1, _ := rec.Address()
	again, _ := Over(rec.Keys(), host)
	if a2, _ := again.Address(); a1 != a2 {
		t.Fatal("same host, different address")
	}
	moved := Manifest{KernelRelease: "6.19.0", Arch: "arm64"}
	if _, err := Over([]string{CRIUVersion}, moved); !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), CRIUVersion) {
		t.Fatalf("missing: %v", err)
	}
}

func mustHex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHostOnThisMachine(t *testing.T) {
	m, err := Host("/proc/cpuinfo", Manifest{CRIUVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{KernelRelease, Arch, CPUFeatures, CPUFlags, CRIUVersion, CRIUImages} {
		if m[k] == "" {
			t.Errorf("no %s", k)
		}
	}
	if !strings.Contains(" "+m[CPUFlags]+" ", " fpu ") && !strings.Contains(" "+m[CPUFlags]+" ", " fp ") {
		t.Errorf("cpu flags %q: no fpu", m[CPUFlags])
	}
	if !strings.HasPrefix(m[CPUFeatures], "b3:") {
		t.Errorf("cpu features %q", m[CPUFeatures])
	}
	if m[CRIUImages] != "criu-images/test" {
		t.Errorf("criu.images %q", m[CRIUImages])
	}
}

func TestCPUFeaturesOrderFree(t *testing.T) {
	dir := t.TempDir()
	a, b := dir+"/a", dir+"/b"
	writeFile(t, a, "processor\t: 0\nflags\t\t: fpu sse avx\n\nprocessor\t: 1\nflags\t\t: fpu\n")
	writeFile(t, b, "processor\t: 0\nflags\t\t: avx  fpu sse avx\n")
	fa, ha, err1 := CPUOf(a)
	fb, _, err2 := CPUOf(b)
	if err1 != nil || err2 != nil || fa != fb || fa != "avx fpu sse" {
		t.Fatalf("%q %q %v %v", fa, fb, err1, err2)
	}
	// cpu.features is what format 1 recorded: the address of the
	// sorted flags.
	if ha != record.Sum([]byte("avx fpu sse")).String() {
		t.Fatalf("cpu features %s", ha)
	}
	writeFile(t, b, "processor\t: 0\nflags\t\t: fpu sse\n")
	if fc, hc, _ := CPUOf(b); fc == fa || hc == ha {
		t.Fatal("a lost flag did not change the flags")
	}
	writeFile(t, b, "processor\t: 0\n")
	if _, _, err := CPUOf(b); err == nil {
		t.Fatal("no flags accepted")
	}
}

func writeFile(t *testing.T, p, s string) {
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
