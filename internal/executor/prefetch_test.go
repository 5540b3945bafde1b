package executor

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestRestoreFiles: the files Prefetch reads are CRIU, runc and the shim
// as PATH finds them, and every shared library CRIU loads, as the
// dynamic loader itself lists them (ldd).
func TestRestoreFiles(t *testing.T) {
	c := &Client{cfg: Config{CRIU: "criu"}}
	files := c.restoreFiles()
	for _, name := range append([]string{"criu"}, restorePrograms...) {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Contains(files, p) {
			t.Errorf("%s (%s) not among %q", name, p, files)
		}
	}
	criu, _ := exec.LookPath("criu")
	out, err := exec.Command("ldd", criu).Output()
	if err != nil {
		t.Fatal(err)
	}
	libs := 0
	for _, f := range strings.Fields(string(out)) {
		if !filepath.IsAbs(f) || filepath.Base(f) == "ld-linux-x86-64.so.2" || filepath.Base(f) == "ld-linux-aarch64.so.1" {
			continue // the loader is named by its program header, not DT_NEEDED
		}
		libs++
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			t.Fatal(err)
		}
		found := slices.ContainsFunc(files, func(p string) bool {
			r, err := filepath.EvalSymlinks(p)
			return err == nil && r == real
		})
		if !found {
			t.Errorf("CRIU's library %s not among %q", f, files)
		}
	}
	if libs < 5 {
		t.Fatalf("ldd %s listed %d libraries:\n%s", criu, libs, out)
	}
}

// TestWillNeed: a file dropped from the page cache is back in it after
// willNeed, without anyone reading it.
func TestWillNeed(t *testing.T) {
	// /var/tmp: a disk's page cache (a tmpfs keeps its pages).
	dir, err := os.MkdirTemp("/var/tmp", "rrx-willneed-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "program")
	b := make([]byte, 4<<20)
	for i := range b {
		b[i] = byte(i)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if n := resident(t, f, len(b)); n > len(b)/4096/2 {
		t.Fatalf("%d of %d pages still cached after FADV_DONTNEED", n, len(b)/4096)
	}
	willNeed(path)
	deadline := time.Now().Add(10 * time.Second)
	for resident(t, f, len(b)) < len(b)/4096 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pages in the page cache 10 s after willNeed", resident(t, f, len(b)), len(b)/4096)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// resident counts f's first size bytes' pages in the page cache.
func resident(t *testing.T, f *os.File, size int) int {
	t.Helper()
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (size+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(size), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
