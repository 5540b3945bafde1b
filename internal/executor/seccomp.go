//go:build linux

package executor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// A restore stacks the spec's seccomp filter, as this host's runc
// compiles it, on every thread it restores (criu.Images.Stack). The
// filter is not compiled here: runc compiles a profile (libseccomp and
// its own BPF patching, which vary with their versions), so the executor
// runs a throwaway container under exactly the spec's profile and
// no_new_privs, once per profile in the process's life, and reads the
// filters its process holds through ptrace (PTRACE_SECCOMP_GET_FILTER,
// which CRIU's dump uses too: the same bytes a dump would write).

// filterDeadline bounds the throwaway container's start and the read.
const filterDeadline = 30 * time.Second

// seccompFilters are the filters read for each seccomp profile, by the
// sha256 of its JSON; mu also keeps two reads of one profile from
// running at once.
type seccompFilters struct {
	mu sync.Mutex
	m  map[[32]byte][]criu.Filter
}

// specFilters is the filters this host's runc installs for profile,
// read once (compileFilters) and then kept.
func (c *Client) specFilters(ctx context.Context, profile *specs.LinuxSeccomp) ([]criu.Filter, error) {
	b, err := json.Marshal(profile)
	if err != nil {
		return nil, err
	}
	key := sha256.Sum256(b)
	c.filters.mu.Lock()
	defer c.filters.mu.Unlock()
	if f, ok := c.filters.m[key]; ok {
		return f, nil
	}
	t0 := time.Now()
	f, err := c.compileFilters(ctx, profile)
	if err != nil {
		return nil, fmt.Errorf("the spec's seccomp filter: %w", err)
	}
	if c.filters.m == nil {
		c.filters.m = map[[32]byte][]criu.Filter{}
	}
	c.filters.m[key] = f
	c.log.Info("seccomp: the spec's filter read from runc", "filters", len(f), "took", time.Since(t0))
	return f, nil
}

// compileFilters runs the host's sleep in a throwaway container of the
// probe's (probe_container.go) under profile and no_new_privs, and reads
// its seccomp filters once it has exec'd. Everything it made is removed.
func (c *Client) compileFilters(ctx context.Context, profile *specs.LinuxSeccomp) ([]criu.Filter, error) {
	ns := c.probeNamespace()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(ctx, ns), filterDeadline)
	defer cancel()
	id, dir, err := c.probeDir()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := removeTree(dir); err != nil {
			c.log.Warn("seccomp: removing the throwaway container's directory", "dir", dir, "err", err)
		}
	}()
	p := &containerProbe{
		c: c, ns: ns, id: id, deadline: filterDeadline, root: filepath.Join(dir, "rootfs"),
		netns: filepath.Join(c.cfg.StateDir, "netns-probe", id),
		extra: []oci.SpecOpts{oci.WithNoNewPrivileges, withSeccomp(profile)},
	}
	if err := p.makeRoot(); err != nil {
		return nil, err
	}
	defer removeNetns(p.netns)
	cont, task, err := p.start(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("a container under the profile: %w", err)
	}
	defer c.removeProbe(ctx, cont, task)
	pid := int(task.Pid())
	if err := waitExec(ctx, pid, "sleep"); err != nil {
		return nil, err
	}
	return readFilters(pid)
}

// withSeccomp sets the spec's seccomp profile to a copy of profile.
func withSeccomp(profile *specs.LinuxSeccomp) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		b, err := json.Marshal(profile)
		if err != nil {
			return err
		}
		s.Linux.Seccomp = &specs.LinuxSeccomp{}
		return json.Unmarshal(b, s.Linux.Seccomp)
	}
}

// waitExec waits until process pid runs comm (runc's init has installed
// the filters, then exec'd it).
func waitExec(ctx context.Context, pid int, comm string) error {
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			return err
		}
		if string(bytes.TrimSpace(b)) == comm {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the throwaway container's process runs %q, not %s: %w", bytes.TrimSpace(b), comm, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// PTRACE_SECCOMP_GET_METADATA (linux/ptrace.h): what x/sys/unix lacks.
const ptraceSeccompGetMetadata = 0x420d

// readFilters reads process pid's seccomp filters, the first installed
// first, with their flags: seized and stopped, on one locked thread (a
// tracer is a thread), then let go.
func readFilters(pid int) (_ []criu.Filter, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(pid); err != nil {
		return nil, fmt.Errorf("ptrace seize %d: %w", pid, err)
	}
	defer func() {
		if derr := unix.PtraceDetach(pid); derr != nil && err == nil {
			err = fmt.Errorf("ptrace detach %d: %w", pid, derr)
		}
	}()
	if err := unix.PtraceInterrupt(pid); err != nil {
		return nil, fmt.Errorf("ptrace interrupt %d: %w", pid, err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
		return nil, fmt.Errorf("waiting for %d to stop: %w", pid, err)
	}
	var out []criu.Filter
	buf := make([]byte, 8*4096) // BPF_MAXINSNS
	for i := 0; ; i++ {
		n, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(pid), uintptr(i), uintptr(unsafe.Pointer(&buf[0])), 0, 0)
		if errno == unix.ENOENT {
			break
		}
		if errno != 0 {
			return nil, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER %d of %d: %w", i, pid, errno)
		}
		if n == 0 || n > 4096 || i == 64 {
			return nil, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER %d of %d: %d instructions", i, pid, n)
		}
		meta := struct{ off, flags uint64 }{off: uint64(i)}
		if _, _, errno := unix.Syscall6(unix.SYS_PTRACE, ptraceSeccompGetMetadata, uintptr(pid), unsafe.Sizeof(meta), uintptr(unsafe.Pointer(&meta)), 0, 0); errno != 0 {
			return nil, fmt.Errorf("PTRACE_SECCOMP_GET_METADATA %d of %d: %w", i, pid, errno)
		}
		out = append(out, criu.Filter{Insns: bytes.Clone(buf[:8*n]), Flags: uint32(meta.flags)})
	}
	if len(out) == 0 {
		return nil, errors.New("the throwaway container's process holds no seccomp filter")
	}
	return out, nil
}
