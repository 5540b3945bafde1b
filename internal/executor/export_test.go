package executor

// Test-only access for the external tests (package executor_test).

import (
	"context"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"

	"github.com/runrecordd/runrecordd/internal/criu"
)

var (
	WriteOverlayDiff     = writeOverlayDiff
	WriteOverlayDiffFile = writeOverlayDiffFile
	ErrNoUpperDir        = errNoUpperDir
)

// ContainerdForTest is the client's containerd client.
func (c *Client) ContainerdForTest() *containerd.Client { return c.client }

// NamespacedForTest is ctx in the client's namespace.
func (c *Client) NamespacedForTest(ctx context.Context) context.Context { return c.ctx(ctx) }

// ApplyLayerForTest is the restore path's apply of a rw layer tar onto the
// snapshot key, whose mounts are mounts.
func (c *Client) ApplyLayerForTest(ctx context.Context, key, layer string, mounts []mount.Mount) error {
	return c.applyLayer(c.ctx(ctx), key, layer, mounts, nil)
}

// DiffServiceLayerForTest is the diff service's layer of the snapshot key
// of snapshotter, copied durably to path: the rw layer's fallback.
func (c *Client) DiffServiceLayerForTest(ctx context.Context, snapshotter, key, path string) (int64, error) {
	return c.diffServiceLayer(c.ctx(ctx), snapshotter, key, path, 1<<62)
}

// ReadFiltersForTest is process pid's seccomp filters, the first
// installed first (readFilters).
func ReadFiltersForTest(pid int) ([]criu.Filter, error) { return readFilters(pid) }

// SpecFiltersForTest is the filters a restore into s stacks: its spec's
// profile as runc compiles it (specFilters).
func (s *Sandbox) SpecFiltersForTest(ctx context.Context) ([]criu.Filter, error) {
	ctx = s.c.ctx(ctx)
	spec, err := s.cont.Spec(ctx)
	if err != nil {
		return nil, err
	}
	return s.c.specFilters(ctx, spec.Linux.Seccomp)
}

// LeaveLazyConfigForTest writes sandbox id's CRIU configuration as a
// daemon that crashed between a lazy restore and the configuration's
// repair leaves it: with the lazy-pages line.
func (c *Client) LeaveLazyConfigForTest(id string) error {
	return c.criu.WriteConfOf(id, criu.LazyConf)
}
