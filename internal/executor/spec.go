//go:build linux

package executor

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Spec is what a sandbox runs and what it may use.
type Spec struct {
	// Image is the image's name, as imported.
	Image string
	// ImageDigest, when set, is the manifest digest the image must have
	// ("sha256:…"); a different one is [ErrImageMismatch].
	ImageDigest string
	// Args is the argv; empty runs the image's entrypoint and cmd.
	Args []string
	// Env entries (KEY=VALUE) override or extend the image's.
	Env []string
	// MilliCPU is the CPU limit in thousandths of a core, enforced as a CFS
	// quota over a 100 ms period; 0 is unlimited, otherwise at least 10.
	MilliCPU uint32
	// MemoryBytes is the memory limit; 0 is [DefaultMemoryBytes].
	MemoryBytes uint64
	// Pids caps the processes and threads of the sandbox (its cgroup's
	// pids controller); 0 is unit.DefaultLimits.Pids.
	Pids uint32
	// LogBytes caps each of stdout and stderr: what the unit writes past
	// it is discarded, after one line saying so (see [Output]); 0 is
	// unit.DefaultLimits.LogBytes.
	LogBytes uint64
	// RootfsBytes caps the rw layer a checkpoint writes (see
	// [Checkpoint.MaxRootfsBytes]); 0 is unit.DefaultLimits.SnapshotBytes.
	RootfsBytes uint64
	// Network is the sandbox's network: its own namespace either way, with
	// loopback down ([unit.NoNetwork], also the zero value) or up
	// ([unit.Loopback], [unit.Egress]), and MPTCP off (netns_linux.go).
	Network unit.Network
	// Link, with network egress, links the sandbox's network namespace,
	// given by its path, to the host (internal/egress, by the daemon)
	// once it exists and before the unit's first instruction: at the
	// create, and at every restore (runc restores the namespace empty).
	// Required with network egress (link.go).
	Link func(netns string) error
	// Mounts are bind mounts, mounted in order. Their sources must pass
	// the host-path policy (see [Mount]).
	Mounts []Mount
	// UserNS, when set, is the host range the sandbox's user namespace
	// maps its ids 0 up to idmap.Size-1 to (userns.go); nil runs the
	// unit without one, as the host's root.
	UserNS *idmap.Range
}

// DefaultMemoryBytes is a sandbox's memory limit when its spec (its grant
// set) names none.
const DefaultMemoryBytes = 1 << 30

// Mount is a bind mount of a host path into the sandbox: recursive (the
// mounts below the source come along), nosuid and nodev on every one of
// them, and, unless Writable, read-only on every one of them too.
//
// The source must be a directory or a regular file once its symlinks are
// resolved, and neither the host's root nor in /proc, /sys, /dev or /run
// ([unit.CheckSource]); nor, unless Own, the executor's state directory
// or a [Config.Protected] directory, something inside one, or a
// directory holding one. Otherwise the sandbox is not made:
// [ErrInvalid].
type Mount struct {
	Source string // absolute host path
	Target string // absolute path in the sandbox
	// Writable mounts read-write (a transcript directory); otherwise
	// read-only.
	Writable bool
	// Own marks a mount the daemon makes for itself (the transcript
	// channel, under its state directory), which may lie inside a
	// protected directory; it is also noexec. Every other rule holds.
	Own bool
}

// SpecOf is the sandbox spec of a unit run under grants.
func SpecOf(s unit.Spec, g unit.Grants) Spec {
	out := Spec{
		Image:       s.Image,
		ImageDigest: s.ImageDigest,
		Args:        s.Args,
		Env:         s.Env,
		MilliCPU:    g.MilliCPU,
		MemoryBytes: g.MemoryBytes,
		Network:     g.Network,
	}
	l := g.Limits.Or(unit.DefaultLimits)
	out.Pids, out.LogBytes, out.RootfsBytes = l.Pids, l.LogBytes, l.SnapshotBytes
	for _, m := range g.ReadOnly {
		out.Mounts = append(out.Mounts, Mount{Source: m.Source, Target: m.Target})
	}
	return out
}

func (s *Spec) validate() error {
	if s.Image == "" {
		return fmt.Errorf("%w: spec has no image", ErrInvalid)
	}
	if s.MilliCPU != 0 && s.MilliCPU < 10 {
		return fmt.Errorf("%w: CPU limit %d millicores is below 10", ErrInvalid, s.MilliCPU)
	}
	switch s.Network {
	case 0, unit.NoNetwork, unit.Loopback:
	case unit.Egress:
		if s.Link == nil {
			return fmt.Errorf("%w: network egress without a link", ErrInvalid)
		}
	default:
		return fmt.Errorf("%w: network %s", ErrInvalid, s.Network)
	}
	for _, m := range s.Mounts {
		if !path.IsAbs(m.Source) || !path.IsAbs(m.Target) || path.Clean(m.Target) == "/" {
			return fmt.Errorf("%w: mount %s:%s: paths must be absolute, target not /", ErrInvalid, m.Source, m.Target)
		}
	}
	return nil
}

// withDefaults is s with its zero limits at their defaults.
func (s Spec) withDefaults() Spec {
	if s.MemoryBytes == 0 {
		s.MemoryBytes = DefaultMemoryBytes
	}
	if s.Pids == 0 {
		s.Pids = unit.DefaultLimits.Pids
	}
	if s.LogBytes == 0 {
		s.LogBytes = unit.DefaultLimits.LogBytes
	}
	if s.RootfsBytes == 0 {
		s.RootfsBytes = unit.DefaultLimits.SnapshotBytes
	}
	return s
}

// checkSource applies the host-path policy (see [Mount]) to m's source.
func (c *Client) checkSource(m Mount) error {
	refuse := func(why string, args ...any) error {
		return fmt.Errorf("%w: mount source %s: %s", ErrInvalid, m.Source, fmt.Sprintf(why, args...))
	}
	if err := unit.CheckSource(path.Clean(m.Source)); err != nil {
		return refuse("%v", err)
	}
	real, err := filepath.EvalSymlinks(m.Source)
	if err != nil {
		return refuse("%v", err)
	}
	if err := unit.CheckSource(real); err != nil {
		return refuse("resolves to %s: %v", real, err)
	}
	fi, err := os.Lstat(real)
	if err != nil {
		return refuse("%v", err)
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return refuse("resolves to %s, a %s: only directories and regular files are mounted", real, fileType(fi.Mode()))
	}
	if m.Own {
		return nil
	}
	for _, p := range append([]string{c.cfg.StateDir}, c.cfg.Protected...) {
		if rp, err := filepath.EvalSymlinks(p); err == nil {
			p = rp
		}
		if within(real, p) || within(p, real) {
			return refuse("resolves to %s, which is, holds or lies in the protected %s", real, p)
		}
	}
	return nil
}

// within says whether path p is dir or lies under it (both clean and
// absolute).
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

func fileType(m os.FileMode) string {
	switch {
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

func (c *Client) specOpts(img containerd.Image, id string, spec Spec) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithHostname("unit"),
		oci.WithCgroup(path.Join(c.cfg.CgroupParent, id)),
		// runc hands this file to CRIU at every dump and restore of the
		// sandbox (criu.Conf).
		oci.WithAnnotations(map[string]string{criu.ConfAnnotation: c.criu.Conf()}),
	}
	if spec.UserNS != nil {
		opts = append(opts, usernsOpts(*spec.UserNS, spec.Network, c.linkDir(id))...)
	} else {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: c.netnsPath(id)}))
	}
	if len(spec.Args) > 0 {
		opts = append(opts, oci.WithProcessArgs(spec.Args...))
	}
	if len(spec.Env) > 0 {
		opts = append(opts, oci.WithEnv(spec.Env))
	}
	if spec.MilliCPU > 0 {
		const period = 100_000 // µs
		opts = append(opts, oci.WithCPUCFS(int64(spec.MilliCPU)*period/1000, period))
	}
	// spec has its defaults (withDefaults): never unlimited.
	opts = append(opts, oci.WithMemoryLimit(spec.MemoryBytes), oci.WithPidsLimit(int64(spec.Pids)))
	if len(spec.Mounts) > 0 {
		var ms []specs.Mount
		for _, m := range spec.Mounts {
			ms = append(ms, specs.Mount{
				Destination: m.Target,
				Type:        "bind",
				Source:      m.Source,
				Options:     mountOptions(m),
			})
		}
		opts = append(opts, oci.WithMounts(ms))
	}
	// After the capabilities (containerd's default set, from
	// WithNewSpec), which the profile follows: it allows what they
	// allow. no_new_privs is containerd's default too; said here so
	// that it stays.
	return append(opts, withUnitLimits(spec.Pids), oci.WithNoNewPrivileges, seccomp.WithDefaultProfile())
}

// UnitOOMScoreAdj is every unit's oom_score_adj: the OOM killer's first
// choice on the host, before the daemon, containerd and the shims, which
// a unit would otherwise inherit (-998 under the shipped systemd unit's
// OOMScoreAdjust=-999). A unit cannot lower it (that needs
// CAP_SYS_RESOURCE), and a restore raises one lower to it
// (criu.Images.Narrow).
const UnitOOMScoreAdj = 1000

// unitRlimits are the resource limits every unit runs under, soft and
// hard, where the spec sets none of that resource (containerd's default
// spec sets RLIMIT_NOFILE 1024): what a unit would otherwise inherit is
// the daemon's (the shipped systemd unit's LimitNOFILE, LimitNPROC and
// LimitCORE among them). RLIMIT_NPROC is the sandbox's pids limit.
// Infinity is RLIM_INFINITY.
var unitRlimits = []struct {
	name       string
	soft, hard uint64
}{
	{"RLIMIT_CPU", rlimInfinity, rlimInfinity},
	{"RLIMIT_FSIZE", rlimInfinity, rlimInfinity},
	{"RLIMIT_DATA", rlimInfinity, rlimInfinity},
	{"RLIMIT_STACK", 8 << 20, rlimInfinity},
	{"RLIMIT_CORE", 0, 0},
	{"RLIMIT_RSS", rlimInfinity, rlimInfinity},
	{"RLIMIT_NPROC", 0, 0}, // the pids limit
	{"RLIMIT_NOFILE", 1024, 1024},
	{"RLIMIT_MEMLOCK", 8 << 20, 8 << 20},
	{"RLIMIT_AS", rlimInfinity, rlimInfinity},
	{"RLIMIT_LOCKS", rlimInfinity, rlimInfinity},
	{"RLIMIT_SIGPENDING", 1 << 16, 1 << 16},
	{"RLIMIT_MSGQUEUE", 819200, 819200},
	{"RLIMIT_NICE", 0, 0},
	{"RLIMIT_RTPRIO", 0, 0},
	{"RLIMIT_RTTIME", rlimInfinity, rlimInfinity},
}

const rlimInfinity = ^uint64(0)

// withUnitLimits sets the unit's oom_score_adj (UnitOOMScoreAdj) and
// the limits of unitRlimits the spec does not set, RLIMIT_NPROC to pids.
func withUnitLimits(pids uint32) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		adj := UnitOOMScoreAdj
		s.Process.OOMScoreAdj = &adj
		for _, l := range unitRlimits {
			if slices.ContainsFunc(s.Process.Rlimits, func(r specs.POSIXRlimit) bool { return r.Type == l.name }) {
				continue
			}
			if l.name == "RLIMIT_NPROC" {
				l.soft, l.hard = uint64(pids), uint64(pids)
			}
			s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: l.name, Soft: l.soft, Hard: l.hard})
		}
		return nil
	}
}

// mountOptions are the OCI options of a bind mount. "ro" alone makes only
// the top mount read-only: a mount below the source (rbind brings them
// along) would stay writable. runc (1.1 and later) applies the r* options
// with mount_setattr(AT_RECURSIVE) to the whole tree.
func mountOptions(m Mount) []string {
	opts := []string{"rbind", "nosuid", "nodev", "rnosuid", "rnodev"}
	if m.Writable {
		opts = append(opts, "rw")
	} else {
		opts = append(opts, "ro", "rro")
	}
	if m.Own {
		opts = append(opts, "noexec", "rnoexec")
	}
	return opts
}
