package store

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func newHasher() *blake3.Hasher { return blake3.New(32, nil) }

func TestIngestAndMaterialize(t *testing.T) {
	s := mustStore(t)
	stage, err := s.StagingDir("criu")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"pages-1.img":  strings.Repeat("p", 3<<20),
		"core-1.img":   "core",
		"sub/x":        "core", // same bytes as core-1.img: one object
		"sub/deep/y.z": "y",
	}
	writeTree(t, stage, files)
	os.Chmod(filepath.Join(stage, "sub/deep/y.z"), 0o755)
	// Ingest renames, never copies: the object is the staged inode.
	var staged syscall.Stat_t
	syscall.Stat(filepath.Join(stage, "pages-1.img"), &staged)

	a, st, err := s.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 4 || st.New != 3 || st.Bytes != 3<<20+4+4+1 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := os.Stat(stage); !os.IsNotExist(err) {
		t.Fatal("staging not removed")
	}
	var stored syscall.Stat_t
	syscall.Stat(s.Path(record.Sum([]byte(files["pages-1.img"]))), &stored)
	if stored.Ino != staged.Ino || stored.Dev != staged.Dev {
		t.Fatal("ingest copied a file instead of renaming it")
	}
	entries, err := s.Listing(a)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, fmt.Sprintf("%s:%o:%d", e.Name, e.Mode, e.Size))
	}
	if got := strings.Join(names, " "); got != "core-1.img:644:4 pages-1.img:644:3145728 sub/deep/y.z:755:1 sub/x:644:4" {
		t.Fatalf("listing %s", got)
	}
	if refs, _ := s.Refs(a); len(refs) != 3 {
		t.Fatalf("the listing declares %d refs, want its 3 distinct files", len(refs))
	}
	if err := s.VerifyDir(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	for _, how := range []Layout{LinkFiles, CopyFiles} {
		out := filepath.Join(t.TempDir(), "restore")
		if err := s.Materialize(t.Context(), a, out, how); err != nil {
			t.Fatal(err)
		}
		for name, c := range files {
			p := filepath.Join(out, name)
			if b, _ := os.ReadFile(p); string(b) != c {
				t.Fatalf("layout %d, %s: %d bytes", how, name, len(b))
			}
			info, _ := os.Stat(p)
			if how == CopyFiles && name == "sub/deep/y.z" && info.Mode().Perm() != 0o755 {
				t.Fatalf("copy lost the mode: %v", info.Mode())
			}
			if how == LinkFiles && info.Mode().Perm() != 0o400 {
				t.Fatalf("link is not the read-only object: %v", info.Mode())
			}
		}
	}
	// The same tree again: every file is already stored and dropped.
	stage2, _ := s.StagingDir("again")
	writeTree(t, stage2, files)
	os.Chmod(filepath.Join(stage2, "sub/deep/y.z"), 0o755)
	a2, st2, err := s.Ingest(t.Context(), stage2)
	if err != nil || a2 != a || st2.New != 0 {
		t.Fatalf("second ingest: %s %+v %v", a2, st2, err)
	}
}

// A flipped byte in one file fails verification and materialization,
// naming the directory and the file; nothing is left half laid out.
func TestDirectoryCorruptFile(t *testing.T) {
	s := mustStore(t)
	stage, _ := s.StagingDir("criu")
	writeTree(t, stage, map[string]string{"pages-1.img": strings.Repeat("p", 10000), "core-1.img": "core"})
	a, _, err := s.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	pages := record.Sum([]byte(strings.Repeat("p", 10000)))
	damage(t, s, pages, flipByte(5000))
	if err := s.VerifyDir(t.Context(), a); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pages-1.img") || !strings.Contains(err.Error(), a.String()) {
		t.Fatalf("verify: %v", err)
	}
	for _, how := range []Layout{LinkFiles, CopyFiles} {
		out := filepath.Join(t.TempDir(), "restore")
		if err := s.Materialize(t.Context(), a, out, how); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pages-1.img") {
			t.Fatalf("materialize %d: %v", how, err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatal("failed materialize left its target")
		}
	}
	damage(t, s, pages, flipByte(5000))
	// A damaged listing is corrupt too.
	damage(t, s, a, flipByte(20))
	if _, err := s.Listing(a); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("listing: %v", err)
	}
	damage(t, s, a, flipByte(20))
}

func TestIngestRefuses(t *testing.T) {
	s := mustStore(t)
	for name, setup := range map[string]func(dir string){
		"symlink":   func(d string) { os.Symlink("/etc/passwd", filepath.Join(d, "link")) },
		"fifo":      func(d string) { syscall.Mkfifo(filepath.Join(d, "fifo"), 0o600) },
		"empty dir": func(d string) { os.Mkdir(filepath.Join(d, "empty"), 0o700) },
	} {
		stage, _ := s.StagingDir("bad")
		writeTree(t, stage, map[string]string{"ok.img": "ok"})
		setup(stage)
		if _, _, err := s.Ingest(t.Context(), stage); err == nil {
			t.Errorf("%s ingested", name)
		}
	}
	// Staging on another filesystem would need a copy: refused.
	if other, err := os.MkdirTemp("/dev/shm", "stage-"); err == nil {
		defer os.RemoveAll(other)
		writeTree(t, other, map[string]string{"f": "elsewhere"})
		if _, _, err := s.Ingest(t.Context(), other); err == nil || !strings.Contains(err.Error(), "StagingDir") {
			t.Errorf("cross-filesystem staging: %v", err)
		}
	}
	// An empty tree is a valid, empty directory object.
	stage, _ := s.StagingDir("empty")
	a, st, err := s.Ingest(t.Context(), stage)
	if err != nil || st.Files != 0 {
		t.Fatal(err)
	}
	if es, err := s.Listing(a); err != nil || len(es) != 0 {
		t.Fatalf("empty listing: %v %v", es, err)
	}
}

// The listing's bytes, built by hand.
func TestListingBytes(t *testing.T) {
	fa := record.Sum([]byte("core"))
	got, err := EncodeListing([]Entry{
		{Name: "sub/x", Mode: 0o600, Size: 258, Address: fa},
		{Name: "a", Mode: 0o644, Size: 4, Address: fa},
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	want = append(want, "runrecordd.dir/1"...)
	want = append(want, 0, 0, 0, 2)
	want = append(want, 0, 0, 0, 1, 'a', 0, 0, 1, 0xa4, 0, 0, 0, 0, 0, 0, 0, 4)
	want = append(want, fa[:]...)
	want = append(want, 0, 0, 0, 5, 's', 'u', 'b', '/', 'x', 0, 0, 1, 0x80, 0, 0, 0, 0, 0, 0, 1, 2)
	want = append(want, fa[:]...)
	if string(got) != string(want) {
		t.Fatalf("listing\n got %x\nwant %x", got, want)
	}
}

// Names at and over the limits, and names that are not clean relative
// paths: refused by EncodeListing, and by DecodeListing from bytes laid
// out as EncodeListing would lay them.
var (
	longName     = strings.Repeat(strings.Repeat("n", 99)+"/", 40) + strings.Repeat("n", 95) // 4095 bytes
	longComp     = strings.Repeat("c", 255)
	refusedNames = map[string]string{
		"empty":              "",
		"dot":                ".",
		"dotdot":             "..",
		"dotdot first":       "../x",
		"dotdot last":        "a/..",
		"dotdot inside":      "a/../b",
		"dot first":          "./a",
		"dot inside":         "a/./b",
		"empty component":    "a//b",
		"absolute":           "/a",
		"trailing slash":     "a/",
		"NUL":                "a\x00b",
		"name over 4095":     longName + "n",
		"component over 255": longComp + "c",
		"inner component":    "d/" + longComp + "c" + "/e",
	}
	acceptedNames = []string{"\xff\xfe.img", `a\b`, "a\nb", "...", "..a", "a..", ".hidden", " ", "core-123.img", longComp, longName}
)

// rawListing lays names out as EncodeListing would, in the order given
// and without its checks.
func rawListing(names ...string) []byte {
	b := binary.BigEndian.AppendUint32([]byte(DirDomain), uint32(len(names)))
	for _, n := range names {
		b = binary.BigEndian.AppendUint32(b, uint32(len(n)))
		b = append(append(b, n...), make([]byte, 44)...)
	}
	return b
}

func TestEncodeListingRefuses(t *testing.T) {
	for name, es := range map[string][]Entry{
		"duplicate":     {{Name: "a"}, {Name: "a"}},
		"file and dir":  {{Name: "a"}, {Name: "a/b"}},
		"deep file/dir": {{Name: "a/b"}, {Name: "a/b/c/d"}, {Name: "a/b!"}},
		"apart":         {{Name: "a"}, {Name: "a-b"}, {Name: "a/c"}},
		"second dir":    {{Name: "a/b/c"}, {Name: "a/d/e"}, {Name: "a/d"}},
		"under a chain": {{Name: "a"}, {Name: "a!"}, {Name: "a!!"}, {Name: "a/x"}},
		"beyond perm":   {{Name: "a", Mode: 0o4755}},
	} {
		if _, err := EncodeListing(es); !errors.Is(err, ErrListing) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, n := range refusedNames {
		if _, err := EncodeListing([]Entry{{Name: n}}); !errors.Is(err, ErrListing) {
			t.Errorf("%s: %v", name, err)
		}
		// An empty name is shorter than any entry: refused by its count.
		if _, err := DecodeListing(rawListing(n)); !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrListing) && n != "" {
			t.Errorf("decode, %s: %v", name, err)
		}
	}
	if _, err := EncodeListing([]Entry{{Name: "a"}, {Name: "a!"}, {Name: "a.b/c"}}); err != nil {
		t.Errorf("prefix names that are not directories: %v", err)
	}
	if _, err := EncodeListing([]Entry{{Name: "a"}, {Name: "a!"}, {Name: "a!!"}, {Name: "a!!!/x"}, {Name: "b/x"}}); err != nil {
		t.Errorf("a chain of prefix names: %v", err)
	}
	// Names are bytes: any but NUL, within the limits.
	for _, n := range acceptedNames {
		b, err := EncodeListing([]Entry{{Name: n}})
		if err != nil {
			t.Errorf("%q: %v", n, err)
			continue
		}
		if es, err := DecodeListing(b); err != nil || es[0].Name != n {
			t.Errorf("decode %q: %v", n, err)
		}
	}
}

// checkName's own walk of the components refuses what the rule says: a
// name path.Clean would change, empty, absolute or leaving the directory,
// or holding a NUL. Every name of up to six bytes of "a", ".", "/" and
// NUL, against the rule as path.Clean states it.
func TestCheckNameRule(t *testing.T) {
	rule := func(n string) bool {
		return n != "" && n != "." && n != ".." && !strings.HasPrefix(n, "/") && !strings.HasPrefix(n, "../") &&
			path.Clean(n) == n && !strings.Contains(n, "\x00")
	}
	level, names := []string{""}, []string{""}
	for range 6 {
		var next []string
		for _, n := range level {
			for _, c := range []string{"a", ".", "/", "\x00"} {
				next = append(next, n+c)
			}
		}
		names, level = append(names, next...), next
	}
	seen := map[string]bool{}
	for _, n := range names {
		seen[n] = true
		if ok := checkName(n) == nil; ok != rule(n) {
			t.Errorf("%q: checkName accepts it: %v, the rule: %v", n, ok, rule(n))
		}
	}
	if len(seen) != 5461 {
		t.Fatalf("only %d names tried", len(seen))
	}
}

// Deep names do not make the decode's check allocate per directory: 1,000
// entries of 1,000 levels each (a million distinct directories) decode
// in a few times the listing's own bytes.
func TestDecodeListingDeepNames(t *testing.T) {
	es := make([]Entry, 1000)
	for i := range es {
		es[i].Name = fmt.Sprintf("%04d/", i) + strings.Repeat("a/", 999) + "f"
	}
	b, err := EncodeListing(es)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := DecodeListing(b)
	runtime.ReadMemStats(&after)
	if err != nil || len(got) != len(es) {
		t.Fatalf("%d entries, %v", len(got), err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4*uint64(len(b)) {
		t.Fatalf("decoding %d bytes allocated %d", len(b), n)
	}
}

// A listing holds at most MaxEntries entries and MaxListingBytes bytes.
// Over either it is refused before anything is allocated for it.
func TestListingLimits(t *testing.T) {
	if _, err := EncodeListing(make([]Entry, MaxEntries+1)); !errors.Is(err, ErrListing) {
		t.Fatalf("encode of %d entries: %v", MaxEntries+1, err)
	}
	long := make([]Entry, MaxListingBytes/(len(longName)+48)+1)
	for i := range long {
		long[i].Name = longName
	}
	if _, err := EncodeListing(long); !errors.Is(err, ErrListing) {
		t.Fatalf("encode of %d names of %d bytes: %v", len(long), len(longName), err)
	}
	// A count over the limit in as many bytes as it takes (lazily zeroed
	// pages): refused, and not by allocating 64 MiB of entries first.
	over := make([]byte, len(DirDomain)+4+(MaxEntries+1)*entryMin)
	copy(over, rawListing())
	binary.BigEndian.PutUint32(over[len(DirDomain):], MaxEntries+1)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := DecodeListing(over)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrListing) {
		t.Fatalf("decode of %d entries: %v", MaxEntries+1, err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("refusing %d entries allocated %d bytes", MaxEntries+1, n)
	}
	if _, err := DecodeListing(make([]byte, MaxListingBytes+1)); !errors.Is(err, ErrListing) {
		t.Fatalf("decode of %d bytes: %v", MaxListingBytes+1, err)
	}
	if testing.Short() {
		return
	}
	// MaxEntries short names fit in MaxListingBytes.
	full := make([]Entry, MaxEntries)
	for i := range full {
		full[i].Name = fmt.Sprintf("%06x", i)
	}
	b, err := EncodeListing(full)
	if err != nil {
		t.Fatal(err)
	}
	if es, err := DecodeListing(b); err != nil || len(es) != MaxEntries {
		t.Fatalf("decode of %d entries: %v", MaxEntries, err)
	}
}

// What a producer writes ingests: names are bytes (not necessarily
// UTF-8), and deep rootfs paths are within the name limits.
func TestIngestNamesAreBytes(t *testing.T) {
	s := mustStore(t)
	stage, _ := s.StagingDir("names")
	deep := strings.Repeat("usr/lib/python3/site-packages/", 40) + "x.pyc" // 1205 bytes
	files := map[string]string{"\xff\xfe.img": "latin", `a\b`: "backslash", deep: "deep", "core-123.img": "core", "pages-1.img": "pages"}
	writeTree(t, stage, files)
	a, _, err := s.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if err := s.Materialize(t.Context(), a, out, CopyFiles); err != nil {
		t.Fatal(err)
	}
	for name, c := range files {
		if b, err := os.ReadFile(filepath.Join(out, name)); string(b) != c {
			t.Fatalf("%q: %q, %v", name, b, err)
		}
	}
}

func TestDecodeListingStrict(t *testing.T) {
	good, _ := EncodeListing([]Entry{{Name: "a", Size: 1}, {Name: "b", Size: 2}})
	if es, err := DecodeListing(good); err != nil || len(es) != 2 {
		t.Fatal(err)
	}
	entry := func(name string) []byte {
		one, _ := EncodeListing([]Entry{{Name: name}})
		return one[len(DirDomain)+4:]
	}
	unsorted := append([]byte(DirDomain), 0, 0, 0, 2)
	unsorted = append(append(unsorted, entry("b")...), entry("a")...)
	dup := append([]byte(DirDomain), 0, 0, 0, 2)
	dup = append(append(dup, entry("a")...), entry("a")...)
	for name, b := range map[string][]byte{
		"truncated":  good[:len(good)-1],
		"trailing":   append(append([]byte{}, good...), 0),
		"unsorted":   unsorted,
		"duplicate":  dup,
		"no header":  good[1:],
		"huge count": append([]byte(DirDomain), 0xff, 0xff, 0xff, 0xff),
		"empty":      nil,
	} {
		if _, err := DecodeListing(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzDecodeListing(f *testing.F) {
	good, _ := EncodeListing([]Entry{{Name: "a", Size: 1, Mode: 0o644}, {Name: "b/c", Size: 2}})
	f.Add(good)
	f.Add([]byte(DirDomain + "\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := DecodeListing(b)
		if err != nil {
			return
		}
		again, err := EncodeListing(es)
		if err != nil || string(again) != string(b) {
			t.Fatalf("decoded listing does not re-encode to its bytes: %v", err)
		}
	})
}

// A one-file listing and its address, in hex.
func ExampleEncodeListing() {
	file := record.Sum([]byte("core"))
	b, _ := EncodeListing([]Entry{{Name: "core-1.img", Mode: 0o600, Size: 4, Address: file}})
	fmt.Println(hex.EncodeToString(b[:len(DirDomain)]))
	fmt.Println(hex.EncodeToString(b[len(DirDomain):]))
	fmt.Println(record.Sum(b))
	// Output:
	// 72756e7265636f7264642e6469722f31
	// 000000010000000a636f72652d312e696d6700000180000000000000000423460271b9ea508d1c6d86a5a45a00594d17c96b0795d4d00e1c1dd5d0f9cfaa
	// b3:nLYWCtpm1qg_geGFdfKC_EKCB1Wwy6o5KLJE503N7-U
}

// Two files, one of them nested, listed in byte order of name: "a.txt"
// before "a/b", since '.' (2e) is below '/' (2f) — not the order of a walk
// of the tree, which visits the directory a first.
func ExampleEncodeListing_nested() {
	b, _ := EncodeListing([]Entry{
		{Name: "a/b", Mode: 0o755, Size: 1, Address: record.Sum([]byte("b"))},
		{Name: "a.txt", Mode: 0o644, Size: 4, Address: record.Sum([]byte("core"))},
	})
	fmt.Println(hex.EncodeToString(b[len(DirDomain):]))
	fmt.Println(record.Sum(b))
	// Output:
	// 0000000200000005612e747874000001a4000000000000000423460271b9ea508d1c6d86a5a45a00594d17c96b0795d4d00e1c1dd5d0f9cfaa00000003612f62000001ed000000000000000110e5cf3d3c8a4f9f3468c8cc58eea84892a22fdadbc1acb22410190044c1d553
	// b3:ddLEkwGDREpJCurJDCNPUrZytN8ZeF27KA5JSrVyzdM
}
