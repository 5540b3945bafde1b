//go:build linux

package executor

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// A gated sandbox (Create, with a gate): its task is started ahead, its
// first process the gate (cmd/runrecordd-gate, bind-mounted read-only
// into the container), which waits for one byte on a FIFO and then
// execs the unit's own argv. Begin writes that byte: no `runc start`
// (which would be most of a warm resume; docs/warm-pool.md). Nothing of the unit runs before the
// byte: the gate is the daemon's own program, run with the unit's user,
// capabilities, seccomp filter and limits, as runc would run the unit.

// GateName is the gate's file name beside the daemon's executable, where
// [Connect] looks for it when [Config.Gate] is empty.
const GateName = "runrecordd-gate"

// Where a gated sandbox sees the gate and its FIFO.
const (
	gateTarget     = "/.runrecordd-gate"
	gateFIFOTarget = "/.runrecordd-gate.fifo"
)

// gateWait bounds how long Begin waits for the gate to open its FIFO and
// take its word.
const gateWait = 5 * time.Second

// gateMinPids is the least pids limit a sandbox is gated with: the gate,
// a Go program, runs a few threads while it waits, each counted against
// the sandbox's limit. Below it, Create leaves the task created.
const gateMinPids = 16

// ErrGate is a gate that cannot be used: not found, not a statically
// linked executable, or not waiting when Begin comes.
var ErrGate = errors.New("executor: gate")

// findGate is the gate [Connect] uses: cfg.Gate, or GateName beside this
// executable if it is there; "" when cfg.Gate is "-" or nothing is found.
// A gate named and unusable is an error; one found and unusable is
// passed over (logged).
func findGate(cfg Config) (string, error) {
	switch cfg.Gate {
	case "-":
		return "", nil
	case "":
		exe, err := os.Executable()
		if err != nil {
			return "", nil
		}
		p := filepath.Join(filepath.Dir(exe), GateName)
		if _, err := os.Stat(p); err != nil {
			return "", nil
		}
		if err := checkGate(p); err != nil {
			cfg.Logger.Warn("the gate beside the daemon is not used: warm sandboxes start with runc start", "err", err)
			return "", nil
		}
		return p, nil
	}
	p, err := filepath.Abs(cfg.Gate)
	if err == nil {
		err = checkGate(p)
	}
	return p, err
}

// checkGate checks that p is a regular, executable, statically linked
// ELF file: it runs in units' images, which need not hold a libc.
func checkGate(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrGate, err)
	}
	// Any unit's user runs it.
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o001 == 0 {
		return fmt.Errorf("%w: %s is not a file every user may execute", ErrGate, p)
	}
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrGate, p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: %s is linked dynamically (build it with CGO_ENABLED=0)", ErrGate, p)
		}
	}
	return nil
}

// installGate copies the gate at src, checked, to STATE/gate-bin, root's
// and read-only: the file sandboxes mount is the one checked, whatever
// becomes of src (a rebuild, an upgrade) while this client runs. A copy
// another client of the same state directory mounts stays as it is: the
// new one replaces its name only.
func installGate(stateDir, src string) (string, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrGate, err)
	}
	dir := filepath.Join(stateDir, "gate-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, ".gate-*")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o555)
	}
	dst := filepath.Join(dir, GateName)
	if err == nil {
		err = checkGate(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return dst, nil
}

// hostID is the host's id of the sandbox's id (a gid with gid) under
// the spec's user namespace maps; id itself without a user namespace.
func hostID(l *specs.Linux, id uint32, gid bool) uint32 {
	if l == nil {
		return id
	}
	maps := l.UIDMappings
	if gid {
		maps = l.GIDMappings
	}
	for _, m := range maps {
		if id >= m.ContainerID && id-m.ContainerID < m.Size {
			return m.HostID + id - m.ContainerID
		}
	}
	return id
}

// gateFIFO is sandbox id's gate FIFO on the host.
func (c *Client) gateFIFO(id string) string { return filepath.Join(c.cfg.StateDir, "gate", id) }

// gateOpts are the spec options that start the gate before the unit's
// argv. They make sandbox id's gate FIFO (and set *made) when the spec is
// made: after build has checked id and found no container of that name,
// so that a live sandbox's FIFO is never made anew.
func (c *Client) gateOpts(id string, made *bool) []oci.SpecOpts {
	fifo := c.gateFIFO(id)
	gated := func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if s.Process == nil || len(s.Process.Args) == 0 {
			return fmt.Errorf("%w: the sandbox has no argv", ErrInvalid)
		}
		if err := os.MkdirAll(filepath.Dir(fifo), 0o700); err != nil {
			return err
		}
		// With a user namespace runc binds the FIFO as the range's
		// root: the directory must let it through.
		if err := Searchable(filepath.Dir(fifo)); err != nil {
			return err
		}
		if err := os.Remove(fifo); err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := unix.Mkfifo(fifo, 0o600); err != nil {
			return fmt.Errorf("gate fifo: %w", err)
		}
		*made = true
		// The gate runs as the unit's user (the image's USER, resolved
		// by now), and opens its FIFO as that user: as the host sees
		// it, through the user namespace's maps if there is one.
		uid, gid := hostID(s.Linux, s.Process.User.UID, false), hostID(s.Linux, s.Process.User.GID, true)
		if err := os.Chown(fifo, int(uid), int(gid)); err != nil {
			return fmt.Errorf("gate fifo: %w", err)
		}
		s.Process.Args = append([]string{gateTarget, gateFIFOTarget}, s.Process.Args...)
		return nil
	}
	mounts := oci.WithMounts([]specs.Mount{
		{Destination: gateTarget, Type: "bind", Source: c.gate, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		{Destination: gateFIFOTarget, Type: "bind", Source: fifo, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}},
	})
	return []oci.SpecOpts{mounts, gated}
}

// openGate says the word to s's gate on FIFO fifo, and returns once the
// gate has closed its end: it has read the word and goes on to exec the
// unit's argv (as runc start returns once the container's init has read
// its exec FIFO).
func (s *Sandbox) openGate(ctx context.Context, fifo string) error {
	deadline := time.Now().Add(gateWait)
	for {
		// Without a reader (the gate not yet in its open), ENXIO.
		fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			err = sayWord(ctx, fd, deadline)
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrGate, err)
			}
			_ = os.Remove(fifo)
			return nil
		}
		if err != unix.ENXIO {
			return fmt.Errorf("%w: %w", ErrGate, err)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("%w: the gate exited before it was opened", ErrGate)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: not waiting after %s", ErrGate, gateWait)
		}
	}
}

// sayWord writes the word on fd, a gate FIFO's write end, and waits until
// deadline for the gate to take it: the FIFO empty again (FIONREAD). A
// reader gone with the word unread (the gate died) is an error at once;
// so is the word not taken by the deadline — the caller discards the
// sandbox, killing whatever might take it later.
func sayWord(ctx context.Context, fd int, deadline time.Time) error {
	if _, err := unix.Write(fd, []byte{'g'}); err != nil {
		return err
	}
	p := []unix.PollFd{{Fd: int32(fd)}}
	for {
		unread, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
		switch {
		case err != nil:
			return err
		case unread == 0:
			return nil
		case p[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0:
			return errors.New("the gate ended without taking its word")
		case time.Now().After(deadline):
			return fmt.Errorf("the gate did not take its word within %s", gateWait)
		case ctx.Err() != nil:
			return ctx.Err()
		}
		// Wakes at once should the reader go; else looks again in 1 ms.
		if _, err := unix.Poll(p, 1); err != nil && err != unix.EINTR {
			return err
		}
	}
}
