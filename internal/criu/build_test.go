package criu

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const hash = "29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9"

func goodRecord() BuildRecord {
	return BuildRecord{Version: "4.2.1", Binary: "/usr/local/sbin/criu", BinarySHA256: hash,
		Source:  Hashed{Name: "criu_4.2.1.orig.tar.xz", SHA256: hash},
		Patches: []Hashed{{Name: "1-lazy-pages-wait.patch", SHA256: hash}, {Name: "2-lazy-pages-keep-uffds.patch", SHA256: hash}},
		RunDir:  "/run/runrecordd-criu"}
}

func encode(t *testing.T, m BuildRecord) []byte {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeBuildRecord(t *testing.T) {
	m, err := DecodeBuildRecord(encode(t, goodRecord()))
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != "4.2.1" || len(m.Patches) != 2 || m.Patches[1].Name != "2-lazy-pages-keep-uffds.patch" || m.RunDir != "/run/runrecordd-criu" {
		t.Errorf("decoded %+v", m)
	}
}

func TestDecodeBuildRecordRefuses(t *testing.T) {
	many := goodRecord()
	many.Patches = nil
	for i := range maxPatches + 1 {
		many.Patches = append(many.Patches, Hashed{Name: strings.Repeat("x", i%5+1), SHA256: hash})
		many.Patches[i].Name = "1-" + many.Patches[i].Name + string(rune('a'+i%26)) + strings.Repeat("y", i/26) + ".patch"
	}
	edit := func(f func(*BuildRecord)) []byte {
		m := goodRecord()
		f(&m)
		return encode(t, m)
	}
	cases := map[string][]byte{
		"empty":           nil,
		"not json":        []byte("version=4.2.1"),
		"array":           []byte("[]"),
		"unknown field":   []byte(`{"version":"4.2.1","extra":1}`),
		"trailing data":   append(encode(t, goodRecord()), []byte(` {}`)...),
		"oversized":       append(encode(t, goodRecord()), make([]byte, maxBuildRecord)...),
		"no version":      edit(func(m *BuildRecord) { m.Version = "" }),
		"bad version":     edit(func(m *BuildRecord) { m.Version = "4.2.1; rm -rf /" }),
		"relative bin":    edit(func(m *BuildRecord) { m.Binary = "criu" }),
		"unclean bin":     edit(func(m *BuildRecord) { m.Binary = "/usr/local/../sbin/criu" }),
		"nul in bin":      edit(func(m *BuildRecord) { m.Binary = "/usr/sbin/cr\x00iu" }),
		"short sha":       edit(func(m *BuildRecord) { m.BinarySHA256 = hash[:63] }),
		"upper sha":       edit(func(m *BuildRecord) { m.BinarySHA256 = strings.ToUpper(hash) }),
		"source name":     edit(func(m *BuildRecord) { m.Source.Name = "../criu.tar.xz" }),
		"source sha":      edit(func(m *BuildRecord) { m.Source.SHA256 = "" }),
		"patch name":      edit(func(m *BuildRecord) { m.Patches[0].Name = "../1-x.patch" }),
		"patch no num":    edit(func(m *BuildRecord) { m.Patches[0].Name = "x.patch" }),
		"patch sha":       edit(func(m *BuildRecord) { m.Patches[1].SHA256 = "b3:" + hash }),
		"patch twice":     edit(func(m *BuildRecord) { m.Patches[1] = m.Patches[0] }),
		"too many":        encode(t, many),
		"relative rundir": edit(func(m *BuildRecord) { m.RunDir = "run" }),
	}
	for name, b := range cases {
		if _, err := DecodeBuildRecord(b); !errors.Is(err, ErrBuildRecord) {
			t.Errorf("%s: %v, want ErrBuildRecord", name, err)
		}
	}
}

func TestReadBuildRecord(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadBuildRecord(filepath.Join(dir, "none.json")); !errors.Is(err, ErrNoBuildRecord) {
		t.Errorf("absent: %v, want ErrNoBuildRecord", err)
	}
	if _, err := ReadBuildRecord(dir); !errors.Is(err, ErrBuildRecord) {
		t.Errorf("a directory: %v, want ErrBuildRecord", err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, append(encode(t, goodRecord()), make([]byte, maxBuildRecord)...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBuildRecord(big); !errors.Is(err, ErrBuildRecord) || !strings.Contains(err.Error(), "over") {
		t.Errorf("oversized: %v, want ErrBuildRecord saying it is over the bound", err)
	}
	good := filepath.Join(dir, "criu.json")
	if err := os.WriteFile(good, encode(t, goodRecord()), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := ReadBuildRecord(good); err != nil || m.Source.Name != "criu_4.2.1.orig.tar.xz" {
		t.Errorf("good: %+v, %v", m, err)
	}
}

// fakeCRIU writes a "binary" holding the given patches' marks and a
// record for it listing patches; it returns both paths.
func fakeCRIU(t *testing.T, marks []Capability, patches []Capability) (bin, record string) {
	t.Helper()
	dir := t.TempDir()
	data := []byte("\x7fELF criu 4.2.1 ")
	for _, cp := range capabilityPatch {
		if slices.Contains(marks, cp.c) && cp.signature != "" {
			data = append(data, cp.signature+"\x00"...)
		}
	}
	bin = filepath.Join(dir, "criu")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	m := goodRecord()
	m.Binary, m.BinarySHA256, m.Patches = bin, hex.EncodeToString(sum[:]), nil
	for _, c := range patches {
		m.Patches = append(m.Patches, Hashed{Name: Patch(c), SHA256: hash})
	}
	record = filepath.Join(dir, "criu.json")
	if err := os.WriteFile(record, encode(t, m), 0o644); err != nil {
		t.Fatal(err)
	}
	return bin, record
}

var all = []Capability{LazyPagesWaits, KeepsUffds, TmpfsRestore, TmpfsDump, UsernsUffd, UsernsCgroupns, TmpfsUserns, TasksKeepUffds}

func TestIdentify(t *testing.T) {
	t.Run("setup's build", func(t *testing.T) {
		bin, man := fakeCRIU(t, all, all)
		b, err := Identify(bin, man)
		if err != nil {
			t.Fatal(err)
		}
		if b.Record == nil || !slices.Equal(b.Capabilities(), all) || len(b.Patches()) != len(all) {
			t.Errorf("build %+v, capabilities %v; want the record taken and all %d", b, b.Capabilities(), len(all))
		}
		if why := b.Lacks(KeepsUffds); why != "" {
			t.Errorf("Lacks(KeepsUffds) = %q", why)
		}
	})
	t.Run("patches 1-4", func(t *testing.T) {
		bin, man := fakeCRIU(t, all[:4], all[:4])
		b, _ := Identify(bin, man)
		if want := all[:4]; !slices.Equal(b.Capabilities(), want) {
			t.Errorf("capabilities %v, want %v", b.Capabilities(), want)
		}
		if why := b.Lacks(UsernsUffd); !strings.Contains(why, "5-lazy-pages-userns-uffd.patch") {
			t.Errorf("Lacks(UsernsUffd) = %q, want the patch named", why)
		}
	})
	t.Run("record claims a mark the binary lacks", func(t *testing.T) {
		bin, man := fakeCRIU(t, []Capability{TmpfsRestore}, all)
		b, _ := Identify(bin, man)
		if b.Has(TmpfsDump) || b.Has(UsernsUffd) || !b.Has(TmpfsRestore) || !b.Has(KeepsUffds) {
			t.Errorf("capabilities %v: want the marks' ones only where the binary holds them", b.Capabilities())
		}
	})
	t.Run("no record", func(t *testing.T) {
		bin, _ := fakeCRIU(t, all, all)
		b, err := Identify(bin, filepath.Join(t.TempDir(), "criu.json"))
		if err != nil {
			t.Fatal(err)
		}
		if want := []Capability{TmpfsRestore, TmpfsDump, UsernsUffd, TmpfsUserns, TasksKeepUffds}; b.Record != nil || !slices.Equal(b.Capabilities(), want) {
			t.Errorf("capabilities %v, want only the marked %v", b.Capabilities(), want)
		}
		if why := b.Lacks(KeepsUffds); !strings.Contains(why, "2-lazy-pages-keep-uffds.patch") || !strings.Contains(why, "no build record") {
			t.Errorf("Lacks(KeepsUffds) = %q, want the patch and the missing record", why)
		}
	})
	t.Run("another binary", func(t *testing.T) {
		bin, man := fakeCRIU(t, all, all)
		if err := os.WriteFile(bin, []byte("\x7fELF upstream criu"), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := Identify(bin, man)
		if err != nil {
			t.Fatal(err)
		}
		if b.Record != nil || len(b.Capabilities()) != 0 || !strings.Contains(b.Unknown, ErrOtherBinary.Error()) {
			t.Errorf("build %+v: want the record refused and no capability", b)
		}
	})
	t.Run("bad record", func(t *testing.T) {
		bin, man := fakeCRIU(t, all, all)
		if err := os.WriteFile(man, []byte(`{"version":`), 0o644); err != nil {
			t.Fatal(err)
		}
		b, _ := Identify(bin, man)
		if b.Record != nil || b.Has(KeepsUffds) || !strings.Contains(b.Unknown, ErrBuildRecord.Error()) {
			t.Errorf("build %+v: want the record refused", b)
		}
	})
	t.Run("no binary", func(t *testing.T) {
		if _, err := Identify(filepath.Join(t.TempDir(), "criu"), BuildFile); err == nil {
			t.Error("a binary that is not there identified")
		}
	})
}

// TestSetupManifest runs deploy/setup.sh's install_criu_manifest (into a
// temporary directory, over a binary made here) and reads what it wrote:
// the record setup writes is one the daemon takes, listing every patch
// of deploy/criu.
func TestSetupManifest(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash: %v", err)
	}
	setup, err := os.ReadFile("../../deploy/setup.sh")
	if err != nil {
		t.Fatal(err)
	}
	var fns []string
	for _, name := range []string{"sha256_of", "install_criu_manifest"} {
		_, rest, ok := strings.Cut(string(setup), "\n"+name+"() {\n")
		body, _, ok2 := strings.Cut(rest, "\n}\n")
		if !ok || !ok2 {
			t.Fatalf("deploy/setup.sh: no function %s", name)
		}
		fns = append(fns, name+"() {\n"+body+"\n}\n")
	}
	dir := t.TempDir()
	bin, man := filepath.Join(dir, "criu"), filepath.Join(dir, "share", "criu.json")
	if err := os.WriteFile(bin, []byte("\x7fELF criu "+TmpfsDump), 0o755); err != nil {
		t.Fatal(err)
	}
	patches, err := filepath.Abs("../../deploy/criu")
	if err != nil {
		t.Fatal(err)
	}
	script := "set -Eeuo pipefail\ndie() { echo \"die: $*\" >&2; exit 1; }\nlog() { :; }\n" +
		"CRIU_VERSION=4.2.1 CRIU_ORIG=criu_4.2.1.orig.tar.xz CRIU_SHA256=" + hash + " CRIU_RUNDIR=/run/runrecordd-criu\n" +
		"CRIU_BIN=" + bin + " CRIU_PATCH_DIR=" + patches + " CRIU_MANIFEST=" + man + "\n" +
		strings.Join(fns, "") + "install_criu_manifest\n"
	if out, err := exec.Command("bash", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("install_criu_manifest: %v: %s", err, out)
	}
	b, err := Identify(bin, man)
	if err != nil {
		t.Fatal(err)
	}
	if b.Record == nil {
		t.Fatalf("setup's record not taken: %s", b.Unknown)
	}
	names, _ := filepath.Glob(filepath.Join(patches, "*.patch"))
	if len(b.Record.Patches) != len(names) || len(names) == 0 {
		t.Errorf("record lists %d patches, deploy/criu holds %d", len(b.Record.Patches), len(names))
	}
	for i, p := range b.Record.Patches {
		data, err := os.ReadFile(names[i])
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(data); p.Name != filepath.Base(names[i]) || p.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("patch %d: %+v, want %s", i, p, names[i])
		}
	}
	if !b.Has(KeepsUffds) || b.Has(TmpfsRestore) {
		t.Errorf("capabilities %v: want keeps-uffds (listed) and not tmpfs-restore (no mark)", b.Capabilities())
	}
}
