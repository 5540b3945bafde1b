//go:build linux

package executor_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/runrecordd/runrecordd/internal/executor"
)

// TestRestoreTmpfs parks and restores a sandbox and finds its tmpfs mounts
// as they were: every entry's type, permission bits, owner, device, link
// target and modification time (to the second, as tar keeps it). The CRIU
// deploy/setup.sh builds (deploy/criu/3-tmpfs-small-restore.patch) restores
// a small tmpfs without tar: every tmpfs here but /dev/shm, which holds a
// file and so goes through tar as before. /run's image is replaced with one
// made here, in GNU tar's format: its directory, link (to a host directory,
// which must stay as it was) and device come back as the image says.
func TestRestoreTmpfs(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "tmpfs"
	s, root, mounts := tmpfsSandbox(t, id, spec, out, func(string) {})
	before := map[string]string{}
	for m := range mounts {
		if m != "/run" {
			before[m] = tmpfsListing(t, filepath.Join(root, m))
		}
	}

	cp := parkAway(t, s)
	host := t.TempDir()
	if err := os.Chmod(host, 0o700); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(cp.ImageDir, fmt.Sprintf("tmpfs-dev-%d.tar.gz.img", mounts["/run"]))
	if _, err := os.Stat(run); err != nil {
		t.Fatalf("/run's image: %v", err)
	}
	const mtime = 1_700_000_000
	writeGNUTar(t, run, []tarHeader{
		{name: "./", typ: '5', mode: 0o711, uid: 123, gid: 456, mtime: mtime},
		{name: "./sub/", typ: '5', mode: 0o750, uid: 7, gid: 8, mtime: mtime + 1},
		{name: "./lnk", typ: '2', mode: 0o777, uid: 5, gid: 6, mtime: mtime + 2, link: host},
		{name: "./nul", typ: '3', mode: 0o640, uid: 9, gid: 10, mtime: mtime + 3, major: 1, minor: 3},
	})

	root = restoreListings(t, ctx, id, spec, cp, out, before)
	if b, err := os.ReadFile(filepath.Join(root, "dev/shm/kept")); err != nil || string(b) != "kept" {
		t.Errorf("/dev/shm/kept after the restore: %q, %v", b, err)
	}
	wantRun := strings.Join([]string{
		fmt.Sprintf(". d711 123:456 0 %d", mtime),
		fmt.Sprintf("lnk L777 5:6 0 %d -> %s", mtime+2, host),
		fmt.Sprintf("nul c640 9:10 259 %d", mtime+3),
		fmt.Sprintf("sub d750 7:8 0 %d", mtime+1),
	}, "\n")
	if got := tmpfsListing(t, filepath.Join(root, "run")); got != wantRun {
		t.Errorf("/run from the image made here:\n%s\nwant:\n%s", got, wantRun)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(host, &st); err != nil || st.Mode&0o7777 != 0o700 || st.Uid != 0 || st.Nlink != 2 {
		t.Errorf("the host directory /run/lnk names: %+v, %v; want it untouched", st, err)
	}
	log, err := os.ReadFile(filepath.Join(client.Config().StateDir, "criu", id, "restore", "restore.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n, want := bytes.Count(log, []byte("restored without tar")), tmpfsCount(mounts)-1; n != want {
		t.Errorf("restore.log: %d tmpfs mounts restored without tar, want %d (all %d but /dev/shm's)", n, want, tmpfsCount(mounts))
	}
}

// tmpfsSandbox starts the oracle as id, lets fill change its root (the
// host's view, /proc/PID/root), puts a file into its /dev/shm (so that
// one tmpfs always goes through tar), and returns the sandbox, that root
// and its tmpfs mounts (tmpfsDirs), which must include /dev, /dev/shm
// and /run.
func tmpfsSandbox(t *testing.T, id string, spec executor.Spec, out executor.Output, fill func(root string)) (*executor.Sandbox, string, map[string]uint64) {
	t.Helper()
	s := mustStart(t, id, spec, out)
	root := fmt.Sprintf("/proc/%d/root", s.Pid())
	fill(root)
	if err := os.WriteFile(filepath.Join(root, "dev/shm/kept"), []byte("kept"), 0o640); err != nil {
		t.Fatal(err)
	}
	mounts := tmpfsDirs(t, s.Pid())
	if !hasKey(mounts, "/dev") || !hasKey(mounts, "/dev/shm") || !hasKey(mounts, "/run") {
		t.Fatalf("tmpfs mounts %v: want /dev, /dev/shm and /run among them", mounts)
	}
	return s, root, mounts
}

// restoreListings restores id from cp, finds every mount of before with
// the listing it had (tmpfsListing), and returns the restored root.
func restoreListings(t *testing.T, ctx context.Context, id string, spec executor.Spec, cp executor.Checkpoint, out executor.Output, before map[string]string) string {
	t.Helper()
	s, _, err := client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	root := fmt.Sprintf("/proc/%d/root", s.Pid())
	for m, want := range before {
		if got := tmpfsListing(t, filepath.Join(root, m)); got != want {
			t.Errorf("%s after the restore:\n%s\nwas:\n%s", m, got, want)
		}
	}
	return root
}

func hasKey(m map[string]uint64, k string) bool { _, ok := m[k]; return ok }

// tmpfsCount is how many tmpfs mounts CRIU dumps and restores for mounts:
// one per file system, however many mount points show it (runc ≥ 1.5
// binds one read-only tmpfs over every directory it masks).
func tmpfsCount(mounts map[string]uint64) int {
	devs := map[uint64]bool{}
	for _, dev := range mounts {
		devs[dev] = true
	}
	return len(devs)
}

// tmpfsDirs is the container's tmpfs mounts on directories (runc mounts
// tmpfs files over nothing; it binds /dev/null over masked files), each
// with the device number CRIU names its image by (major<<20 | minor).
func tmpfsDirs(t *testing.T, pid uint32) map[string]uint64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dirs := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := strings.Index(sc.Text(), " - ")
		if len(fields) < 5 || sep < 0 || !strings.HasPrefix(sc.Text()[sep+3:], "tmpfs ") {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(fmt.Sprintf("/proc/%d/root%s", pid, fields[4]), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			continue
		}
		majmin := strings.SplitN(fields[2], ":", 2)
		major, _ := strconv.ParseUint(majmin[0], 10, 32)
		minor, _ := strconv.ParseUint(majmin[1], 10, 32)
		dirs[fields[4]] = major<<20 | minor
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return dirs
}

// tmpfsListing is dir itself and each entry in it, a line each in name
// order: type and permission bits, owner, device, modification time in
// seconds (left out for an entry with another file system mounted on it:
// that one's root is not in this mount's image), a link's target.
func tmpfsListing(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var top syscall.Stat_t
	if err := syscall.Lstat(dir, &top); err != nil {
		t.Fatal(err)
	}
	names := []string{"."}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	var lines []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		kind := map[uint32]string{syscall.S_IFDIR: "d", syscall.S_IFLNK: "L", syscall.S_IFCHR: "c", syscall.S_IFREG: "-"}[st.Mode&syscall.S_IFMT]
		if kind == "" {
			kind = "?"
		}
		line := fmt.Sprintf("%s %s%o %d:%d %d", n, kind, st.Mode&0o7777, st.Uid, st.Gid, st.Rdev)
		if st.Dev == top.Dev {
			line += fmt.Sprintf(" %d", st.Mtim.Sec)
		}
		if kind == "L" {
			target, err := os.Readlink(p)
			if err != nil {
				t.Fatal(err)
			}
			line += " -> " + target
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// tarHeader is one entry of a tar made by writeGNUTar.
type tarHeader struct {
	name         string
	typ          byte
	mode         int64
	uid, gid     int64
	mtime        int64
	link         string
	major, minor int64
}

// writeGNUTar writes path as tmpfs_dump would: a gzipped tar in GNU
// tar's format, numeric owners, padded to 10240 bytes.
func writeGNUTar(t *testing.T, path string, hs []tarHeader) {
	t.Helper()
	octal := func(f []byte, v int64) { copy(f, fmt.Sprintf("%0*o\x00", len(f)-1, v)) }
	var tar []byte
	for _, h := range hs {
		b := make([]byte, 512)
		copy(b, h.name)
		octal(b[100:108], h.mode)
		octal(b[108:116], h.uid)
		octal(b[116:124], h.gid)
		octal(b[124:136], 0)
		octal(b[136:148], h.mtime)
		b[156] = h.typ
		copy(b[157:257], h.link)
		copy(b[257:265], "ustar  \x00")
		if h.typ == '3' {
			octal(b[329:337], h.major)
			octal(b[337:345], h.minor)
		}
		copy(b[148:156], "        ")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
		tar = append(tar, b...)
	}
	tar = append(tar, make([]byte, 10240-len(tar))...)
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	if _, err := w.Write(tar); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil { // the image may be a hard link
		t.Fatal(err)
	}
	if err := os.WriteFile(path, gz.Bytes(), 0o400); err != nil {
		t.Fatal(err)
	}
}
