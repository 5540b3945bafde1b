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
// (on this project's AMD machines a runc start costs 25-35 ms, most of a
// warm resume; docs/warm-pool.md). Nothing of the unit runs before the
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

// gateWait bounds how long Begin waits for the gate to open its FIFO.
const gateWait = 5 * time.Second

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
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%w: %s is not an executable file", ErrGate, p)
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

// gateFIFO is sandbox id's gate FIFO on the host.
func (c *Client) gateFIFO(id string) string { return filepath.Join(c.cfg.StateDir, "gate", id) }

// makeGate makes sandbox id's gate FIFO and returns the spec options that
// start the gate before the unit's argv.
func (c *Client) makeGate(id string) ([]oci.SpecOpts, error) {
	fifo := c.gateFIFO(id)
	if err := os.MkdirAll(filepath.Dir(fifo), 0o700); err != nil {
		return nil, err
	}
	if err := os.Remove(fifo); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return nil, fmt.Errorf("gate fifo: %w", err)
	}
	gated := func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if s.Process == nil || len(s.Process.Args) == 0 {
			return fmt.Errorf("%w: the sandbox has no argv", ErrInvalid)
		}
		s.Process.Args = append([]string{gateTarget, gateFIFOTarget}, s.Process.Args...)
		return nil
	}
	mounts := oci.WithMounts([]specs.Mount{
		{Destination: gateTarget, Type: "bind", Source: c.gate, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		{Destination: gateFIFOTarget, Type: "bind", Source: fifo, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}},
	})
	return []oci.SpecOpts{mounts, gated}, nil
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
			err = sayWord(fd, deadline)
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
// deadline for its reader to close (poll says POLLERR to a writer left
// without readers).
func sayWord(fd int, deadline time.Time) error {
	if _, err := unix.Write(fd, []byte{'g'}); err != nil {
		return err
	}
	p := []unix.PollFd{{Fd: int32(fd)}}
	for {
		n, err := unix.Poll(p, int(max(time.Until(deadline).Milliseconds(), 0)))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("the gate did not take its word within %s", gateWait)
		case p[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0:
			return nil
		default:
			return fmt.Errorf("poll of the gate's FIFO: events %#x", p[0].Revents)
		}
	}
}
