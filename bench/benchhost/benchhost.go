// Package benchhost is what the executor benchmarks (bench/lazybench,
// bench/chunkbench) stand on: a private containerd under a temporary
// directory, the executor connected to it with its sandboxes under a
// cgroup of the benchmark's own, and one of the project's units built and
// imported — all of it removed by Close. Root only; never run by `make
// test`.
package benchhost

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/ociarchive"
)

// Host is a benchmark's containerd and executor.
type Host struct {
	Dir  string // the temporary directory everything lives under
	Exec *executor.Client
	ctrd *executor.Containerd
	// cgroups are removed at Close, with what is under them.
	cgroups []string
}

// Start starts a private containerd under a new temporary directory named
// from prefix (kept short: socket paths live under it) and connects the
// executor to it, its sandboxes under cgroup. More cgroups (another
// client's namespace) can be named for Close to remove.
func Start(ctx context.Context, prefix, cgroup string, more ...string) (_ *Host, err error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	h := &Host{Dir: dir, cgroups: append([]string{cgroup}, more...)}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if h.ctrd, err = executor.StartContainerd(ctx, filepath.Join(dir, "cd"), log); err != nil {
		return nil, err
	}
	cfg := h.ctrd.Config()
	cfg.Logger, cfg.CgroupParent = log, cgroup
	if h.Exec, err = executor.Connect(ctx, cfg); err != nil {
		return nil, err
	}
	return h, nil
}

// Address is the private containerd's socket (for ctr).
func (h *Host) Address() string { return h.ctrd.Address() }

// ImportUnit builds the project's unit units/NAME (from the module root,
// the working directory) and imports it as image. It returns the image's
// OCI archive, kept under Dir.
func (h *Host) ImportUnit(ctx context.Context, name, image string) (archive string, err error) {
	bin, err := ociarchive.GoBinary(ctx, ".", "./units/"+name)
	if err != nil {
		return "", err
	}
	archive = filepath.Join(h.Dir, "unit.tar")
	if _, err := ociarchive.WriteFile(archive, ociarchive.Unit(image, bin)); err != nil {
		return "", err
	}
	_, err = h.Exec.ImportFile(ctx, archive, image)
	return archive, err
}

// Close stops everything Start started and removes what it left.
func (h *Host) Close() {
	if h.Exec != nil {
		_ = h.Exec.Close()
	}
	if h.ctrd != nil {
		_ = h.ctrd.Stop(context.Background())
		_ = exec.Command("umount", "-R", filepath.Join(h.Dir, "cd")).Run()
	}
	for _, c := range h.cgroups {
		RemoveCgroups(c)
	}
	_ = os.RemoveAll(h.Dir)
}

// RemoveCgroups removes cgroup path (and the cgroups right under it) in
// every hierarchy: what sandboxes left there.
func RemoveCgroups(path string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", path))
	for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", path)) {
		subs, _ := filepath.Glob(filepath.Join(d, "*"))
		for _, s := range subs {
			_ = os.Remove(s)
		}
		_ = os.Remove(d)
	}
}
