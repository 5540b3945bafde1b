//go:build linux

package executor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
)

// DefaultNamespace is the containerd namespace sandboxes live in unless the
// [Config] names another.
const DefaultNamespace = "runrecordd"

// Snapshotter is the snapshotter images are unpacked into and sandboxes'
// root filesystems are made with.
const Snapshotter = "overlayfs"

// Runtime is the containerd runtime sandboxes run under.
const Runtime = "io.containerd.runc.v2"

// Config says which containerd to use and where the executor keeps its own
// state.
type Config struct {
	// Address is containerd's gRPC socket.
	Address string
	// Namespace is the containerd namespace; [DefaultNamespace] when empty.
	Namespace string
	// StateDir holds the executor's files: the FIFOs of sandbox output, the
	// runc root, and CRIU's work directories (dump and restore logs and
	// statistics). Required.
	StateDir string
	// RuncRoot is runc's --root for this executor's sandboxes; StateDir/runc
	// when empty. A private root keeps two executors on one host (or an
	// executor and a system containerd) from sharing runc state.
	RuncRoot string
	// CgroupParent is the cgroup under which each sandbox gets
	// CgroupParent/<id>; "/"+Namespace when empty.
	CgroupParent string
	// Protected are host directories no mount may reach (see [Mount]):
	// the daemon's state directory. StateDir is always protected.
	Protected []string
	// CRIU is the criu binary [Versions] and [Client.Probe] run
	// ([criu.Binary] from PATH when empty). runc finds its own CRIU on the
	// daemon's PATH; [StartContainerd] makes the two agree.
	CRIU string
	// Gate is the runrecordd-gate binary (cmd/runrecordd-gate) a sandbox
	// [Client.Create] makes starts in, so that [Sandbox.Begin] is a
	// byte on a FIFO, not a runc start. Empty: [GateName] beside this
	// executable, if it is there; "-": none (Create leaves the task
	// created, and Begin starts it).
	Gate string
	// Logger receives the executor's events; slog.Default() when nil.
	Logger *slog.Logger
	// ProbeUserNS, when set, is the range of the user namespace in which
	// [Client.Probe] also dumps and restores a container (a range no
	// run holds: [ProbeHolder]'s).
	ProbeUserNS *idmap.Range
}

// ProbeHolder is the holder of the range the probe's container in a user
// namespace maps to: no run id (internal/forms' CheckID refuses a
// leading dot).
const ProbeHolder = ".probe"

// Client is an executor bound to one containerd and one namespace: it
// imports images and starts, checkpoints, restores and destroys sandboxes.
// It is safe for concurrent use; two calls must not use the same sandbox id
// at once.
type Client struct {
	cfg    Config
	client *containerd.Client
	log    *slog.Logger
	gate   string // the gate's path (findGate); "" for none
	// criu are CRIU's files under the state directory.
	criu criu.Dirs
	// filters are the seccomp filters runc compiles, by profile
	// (seccomp.go).
	filters seccompFilters
}

// Connect connects to the containerd at cfg.Address.
func Connect(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.Address == "" || cfg.StateDir == "" {
		return nil, fmt.Errorf("executor: connect: %w: Address and StateDir are required", ErrInvalid)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.RuncRoot == "" {
		cfg.RuncRoot = filepath.Join(cfg.StateDir, "runc")
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/" + cfg.Namespace
	}
	if cfg.CRIU == "" {
		cfg.CRIU = criu.Binary
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	gate, err := findGate(cfg)
	if err != nil {
		return nil, fmt.Errorf("executor: connect: %w", err)
	}
	if gate != "" {
		cfg.Logger.Debug("warm sandboxes start in the gate", "gate", gate)
	}
	for _, d := range []string{cfg.StateDir, cfg.RuncRoot, filepath.Join(cfg.StateDir, "fifo")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("executor: connect: %w", err)
		}
	}
	dirs := criu.Dirs{State: cfg.StateDir}
	if err := dirs.Make(); err != nil {
		return nil, fmt.Errorf("executor: connect: %w", err)
	}
	if gate != "" {
		if gate, err = installGate(cfg.StateDir, gate); err != nil {
			return nil, fmt.Errorf("executor: connect: %w", err)
		}
	}
	c, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace))
	if err != nil {
		return nil, fmt.Errorf("executor: connect to containerd at %s: %w", cfg.Address, err)
	}
	v, err := c.Version(namespaces.WithNamespace(ctx, cfg.Namespace))
	if err == nil {
		err = atLeast("containerd", v.Version, MinContainerd)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("executor: connect to containerd at %s: %w", cfg.Address, err)
	}
	return &Client{cfg: cfg, client: c, log: cfg.Logger.With("component", "executor", "namespace", cfg.Namespace), gate: gate, criu: dirs}, nil
}

// Close closes the connection; sandboxes keep running.
func (c *Client) Close() error { return c.client.Close() }

// Config is the client's configuration with defaults filled in.
func (c *Client) Config() Config { return c.cfg }

func (c *Client) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, c.cfg.Namespace)
}

// Image is an imported image.
type Image struct {
	// Name is the image's name in containerd.
	Name string
	// Digest is the digest of the linux/amd64 image manifest: the
	// image_digest of a unit spec.
	Digest string
}

// Import imports an OCI or docker image archive (a tar stream as written
// by [github.com/runrecordd/runrecordd/internal/ociarchive], `docker save`
// or `ctr images export`), names its index name, and unpacks it into the
// overlayfs snapshotter.
func (c *Client) Import(ctx context.Context, r io.Reader, name string) (Image, error) {
	ctx = c.ctx(ctx)
	if name == "" {
		return Image{}, fmt.Errorf("executor: import: %w: no image name", ErrInvalid)
	}
	if _, err := c.client.Import(ctx, r, containerd.WithIndexName(name)); err != nil {
		return Image{}, fmt.Errorf("executor: import %s: %w", name, err)
	}
	img, err := c.client.GetImage(ctx, name)
	if err != nil {
		return Image{}, fmt.Errorf("executor: import %s: %w", name, err)
	}
	if err := img.Unpack(ctx, Snapshotter); err != nil {
		return Image{}, fmt.Errorf("executor: unpack %s: %w", name, err)
	}
	return c.describe(ctx, img)
}

// ImportFile is [Client.Import] of the archive at path.
func (c *Client) ImportFile(ctx context.Context, path, name string) (Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return Image{}, fmt.Errorf("executor: import %s: %w", name, err)
	}
	defer f.Close()
	return c.Import(ctx, bufio.NewReaderSize(f, 1<<20), name)
}

// Image looks an imported image up by name.
func (c *Client) Image(ctx context.Context, name string) (Image, error) {
	ctx = c.ctx(ctx)
	img, err := c.client.GetImage(ctx, name)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return Image{}, fmt.Errorf("executor: image %s: %w", name, ErrNotFound)
		}
		return Image{}, fmt.Errorf("executor: image %s: %w", name, err)
	}
	return c.describe(ctx, img)
}

func (c *Client) describe(ctx context.Context, img containerd.Image) (Image, error) {
	d, err := manifestDigest(ctx, c.client.ContentStore(), img.Target())
	if err != nil {
		return Image{}, fmt.Errorf("executor: image %s: %w", img.Name(), err)
	}
	return Image{Name: img.Name(), Digest: d}, nil
}

// manifestDigest finds the digest of the manifest for this platform under
// desc, which is a manifest or an index of them.
func manifestDigest(ctx context.Context, cs content.Provider, desc ocispec.Descriptor) (string, error) {
	if images.IsManifestType(desc.MediaType) {
		return desc.Digest.String(), nil
	}
	if !images.IsIndexType(desc.MediaType) {
		return "", fmt.Errorf("%w: target media type %s", ErrInvalid, desc.MediaType)
	}
	data, err := content.ReadBlob(ctx, cs, desc)
	if err != nil {
		return "", err
	}
	var idx ocispec.Index
	if err := json.Unmarshal(data, &idx); err != nil {
		return "", err
	}
	match := platforms.Only(platforms.DefaultSpec())
	var best *ocispec.Descriptor
	for i := range idx.Manifests {
		m := &idx.Manifests[i]
		if m.Platform != nil && !match.Match(*m.Platform) {
			continue
		}
		if best == nil || (m.Platform != nil && best.Platform != nil && match.Less(*m.Platform, *best.Platform)) {
			best = m
		}
	}
	if best == nil {
		return "", fmt.Errorf("%w: no %s manifest", ErrNotFound, platforms.DefaultString())
	}
	return manifestDigest(ctx, cs, *best)
}

// Versions are the runtime's versions, for an environment manifest.
type Versions struct {
	Containerd         string // the daemon's, e.g. "v2.3.7"
	ContainerdRevision string
	Runc               string // first line of `runc --version`, version only
	CRIU               string // e.g. "4.2.1"; empty when CRIU did not answer
	// CRIUErr is why CRIU is empty.
	CRIUErr error
}

// Versions asks the daemon for its version and runs runc and CRIU for
// theirs. CRIU's is left empty, with the reason in CRIUErr, when it does
// not answer `criu --version` within ten seconds: a CRIU that hangs must
// not keep a daemon from starting (its transcript runs need no CRIU).
func (c *Client) Versions(ctx context.Context) (Versions, error) {
	v, err := c.client.Version(c.ctx(ctx))
	if err != nil {
		return Versions{}, fmt.Errorf("executor: containerd version: %w", err)
	}
	out := Versions{Containerd: v.Version, ContainerdRevision: v.Revision}
	runcOut, err := exec.CommandContext(ctx, "runc", "--version").Output()
	if err != nil {
		return Versions{}, fmt.Errorf("executor: runc version: %w: %w", ErrMissing, err)
	}
	first, _, _ := strings.Cut(string(runcOut), "\n")
	out.Runc = strings.TrimSpace(strings.TrimPrefix(first, "runc version"))
	if err := atLeast("runc", out.Runc, MinRunc); err != nil {
		return Versions{}, fmt.Errorf("executor: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out.CRIU, err = criu.Version(cctx, c.cfg.CRIU); err != nil {
		out.CRIUErr = fmt.Errorf("executor: %w: %w", ErrMissing, err)
	}
	return out, nil
}

// The oldest runtime the executor works with (docs/setup.md): containerd
// 2.0, whose client API and task options the executor uses (the embedded
// daemon's configuration needs 2.3), and runc 1.2, the first with idmapped
// mounts.
var (
	MinContainerd = [2]int{2, 0}
	MinRunc       = [2]int{1, 2}
)

// atLeast returns nil if version ("v2.3.7", "1.5.3", "2.3.7+unknown",
// "1.6.20~ds1") is min[0].min[1] or later, and an error wrapping
// [ErrMissing] naming what and version if it is older or unreadable.
func atLeast(what, version string, min [2]int) error {
	v := strings.TrimPrefix(strings.TrimSpace(version), "v")
	var n [2]int
	ok := true
	for i := range n {
		var part string
		part, v, _ = strings.Cut(v, ".")
		end := 0
		for end < len(part) && part[end] >= '0' && part[end] <= '9' {
			end++
		}
		x, err := strconv.Atoi(part[:end])
		if err != nil || (i == 0 && end != len(part)) {
			ok = false
			break
		}
		n[i] = x
	}
	if ok && (n[0] > min[0] || n[0] == min[0] && n[1] >= min[1]) {
		return nil
	}
	return fmt.Errorf("%w: %s %q, need %d.%d or later (deploy/setup.sh installs it)", ErrMissing, what, version, min[0], min[1])
}
