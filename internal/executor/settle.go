//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
)

// Settle puts a sandbox whose checkpoint did not go through back to
// running, going by the task's real state rather than by what the failed
// checkpoint should have left:
//
//   - a CRIU (and the runc that started it) still running beside the unit
//     — a daemon that died in the middle of a park leaves them, holding the
//     unit seized — is killed, and what it may have left in the unit is
//     cleared (see releaseCRIU);
//   - a frozen task (paused, or left pausing) is thawed, and the shim's
//     idea of it made to agree with the freezer;
//   - a running one is left alone, and one that has exited is [ErrExited].
func (s *Sandbox) Settle(ctx context.Context) error {
	if err := s.settle(ctx, false); err != nil {
		return fmt.Errorf("executor: settle %s: %w", s.id, err)
	}
	return nil
}

// settle is Settle; killed says that CRIU was killed already (a deadline).
func (s *Sandbox) settle(ctx context.Context, killed bool) error {
	// The caller's context may be what failed; the thaw must still happen.
	ctx, cancel := context.WithTimeout(s.c.ctx(context.WithoutCancel(ctx)), 30*time.Second)
	defer cancel()
	unit := int(s.task.Pid())
	if pids, err := s.c.freezeThenKill(s.id, unit); err != nil {
		return fmt.Errorf("killing CRIU: %w", err)
	} else if len(pids) > 0 {
		s.c.log.Warn("killed a CRIU left holding the unit", "sandbox", s.id, "pids", pids)
		killed = true
	}
	var errs []error
	if killed {
		errs = append(errs, s.c.releaseCRIU(s.id, unit))
	}
	st, err := s.task.Status(ctx)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return ErrExited
		}
		return errors.Join(append(errs, fmt.Errorf("task status: %w", err))...)
	}
	switch st.Status {
	case containerd.Running:
	case containerd.Stopped:
		return ErrExited
	case containerd.Paused, containerd.Pausing:
		errs = append(errs, s.thaw(ctx))
	default:
		errs = append(errs, fmt.Errorf("task in state %q", st.Status))
	}
	return errors.Join(errs...)
}

// thaw thaws a task the shim holds paused. After a killed CRIU the
// freezer may be thawed already (CRIU thaws the cgroup once it has seized
// the tasks) while the shim still says paused, and runc then refuses the
// resume: the cgroup is frozen again so that runc's resume goes through
// and the shim agrees with the freezer; where that fails too the cgroup is
// thawed directly, so that the unit at least runs.
func (s *Sandbox) thaw(ctx context.Context) error {
	err := s.task.Resume(ctx)
	if err == nil {
		return nil
	}
	if ferr := s.c.setFreezer(s.id, true); ferr == nil {
		if err = s.task.Resume(ctx); err == nil {
			return nil
		}
	}
	if terr := s.c.setFreezer(s.id, false); terr != nil {
		return errors.Join(fmt.Errorf("thaw: %w", err), terr)
	}
	return fmt.Errorf("thawed through the cgroup, but the shim still holds the task paused: %w", err)
}

// setFreezer freezes or thaws sandbox id's cgroup directly: cgroup v1's
// freezer or v2's cgroup.freeze, whichever the host has.
func (c *Client) setFreezer(id string, frozen bool) error {
	rel := path.Join(c.cfg.CgroupParent, id)
	v1 := filepath.Join("/sys/fs/cgroup/freezer", rel, "freezer.state")
	if _, err := os.Stat(v1); err == nil {
		state := "THAWED"
		if frozen {
			state = "FROZEN"
		}
		if err := os.WriteFile(v1, []byte(state), 0); err != nil {
			return err
		}
		if frozen {
			// FREEZING until every task has stopped.
			for range 100 {
				b, err := os.ReadFile(v1)
				if err != nil || strings.TrimSpace(string(b)) == "FROZEN" {
					return err
				}
				time.Sleep(10 * time.Millisecond)
			}
			return fmt.Errorf("cgroup %s did not freeze", rel)
		}
		return nil
	}
	v2 := filepath.Join("/sys/fs/cgroup", rel, "cgroup.freeze")
	if _, err := os.Stat(v2); err == nil {
		state := "0"
		if frozen {
			state = "1"
		}
		return os.WriteFile(v2, []byte(state), 0)
	}
	return fmt.Errorf("no freezer for cgroup %s", rel)
}
