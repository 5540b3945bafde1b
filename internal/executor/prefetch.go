//go:build linux

package executor

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// An image resume runs CRIU (lazy-pages, then the restore runc starts),
// runc, a containerd shim and, when pages are served, this binary again.
// After hours parked their files may be out of the page cache, and a
// restore then waits on the disk for them (from a dropped page cache, a
// sizeable part of a served resume's restore: docs/benchmarks.md). Prefetch asks the kernel to read them in while
// the resume is still rehashing the snapshot.

// restorePrograms are the programs an image restore runs besides CRIU,
// looked up on PATH as containerd's shim and runc look them up.
var restorePrograms = []string{"runc", "containerd-shim-runc-v2"}

// libDirs are where a program's shared libraries are looked for, in
// order: Debian's multiarch directories first.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
	"/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"}

// prefetchFiles is the files Prefetch reads in: found once, the first
// time it is asked.
var prefetchFiles struct {
	once  sync.Once
	paths []string
}

// Prefetch asks the kernel, in the background, to read into the page
// cache the programs an image restore runs and the shared libraries they
// load (posix_fadvise WILLNEED). It returns at once; it changes nothing,
// and a file it cannot find or open is passed over: it only saves the
// restore a wait.
func (c *Client) Prefetch() {
	go func() {
		prefetchFiles.once.Do(func() { prefetchFiles.paths = c.restoreFiles() })
		for _, p := range prefetchFiles.paths {
			willNeed(p)
		}
	}()
}

// restoreFiles is CRIU, restorePrograms, this binary, and every shared
// library each of them needs, directly or through another library.
func (c *Client) restoreFiles() []string {
	var progs []string
	for _, name := range append([]string{c.cfg.CRIU}, restorePrograms...) {
		if p, err := exec.LookPath(name); err == nil {
			progs = append(progs, p)
		}
	}
	seen := map[string]bool{}
	var files []string
	var add func(path string)
	add = func(path string) {
		if seen[path] {
			return
		}
		seen[path] = true
		files = append(files, path)
		for _, lib := range needed(path) {
			if p := findLib(lib); p != "" {
				add(p)
			}
		}
	}
	for _, p := range progs {
		add(p)
	}
	return files
}

// needed is the shared libraries the ELF file at path names (DT_NEEDED);
// none for a static program or a file that is not ELF.
func needed(path string) []string {
	f, err := elf.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	libs, _ := f.ImportedLibraries()
	return libs
}

// findLib is the path of shared library name in libDirs, or "".
func findLib(name string) string {
	if filepath.Base(name) != name {
		return name
	}
	for _, d := range libDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// willNeed starts the kernel reading path's whole file into the page
// cache.
func willNeed(path string) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	_ = unix.Fadvise(fd, 0, 0, unix.FADV_WILLNEED)
}
