//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
)

// Destroy kills the sandbox's processes and deletes its task, container,
// snapshot and CRIU work files. It is idempotent, and safe on a sandbox
// whose task has exited (after a checkpoint).
func (s *Sandbox) Destroy(ctx context.Context) error {
	err := s.destroy(s.c.ctx(ctx))
	if err == nil {
		s.c.lazyPids(s.id).KillLeftovers() // the unit is dead
		err = s.c.removeRuncLeftover(s.id)
	}
	if rerr := removeTree(s.c.criu.Of(s.id)); err == nil {
		err = rerr
	}
	if rerr := removeFile(s.c.gateFIFO(s.id)); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("executor: destroy %s: %w", s.id, err)
	}
	return nil
}

// Kill ends the unit's processes and waits for their exit, keeping its
// sandbox: the task (stopped), the CRIU directory with a lazy restore's
// records (LazyUnfinished), for Destroy. A daemon that dies between the
// two leaves a stopped sandbox the next start finds.
func (s *Sandbox) Kill(ctx context.Context) error {
	ctx = s.c.ctx(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.task == nil {
		return nil
	}
	if err := s.killTask(ctx); err != nil {
		return fmt.Errorf("executor: kill %s: %w", s.id, err)
	}
	return nil
}

func (s *Sandbox) destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.task != nil {
		if err := s.deleteTask(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.cont.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete container: %w", err))
	} else if err := removeNetns(s.c.netnsPath(s.id)); err != nil {
		errs = append(errs, err)
	} else if err := s.c.removeGrants(s.id); err != nil {
		errs = append(errs, err)
	}
	s.closeFilesLocked()
	return errors.Join(errs...)
}

// deleteTask kills the task's processes and deletes the task. A restore
// that a dead daemon left in the shim can have made processes that
// killTask did not see (CRIU forked them after killHelpers listed the
// shim's descendants; the shim, its restore cut short, has no pid for
// them): runc then refuses the delete ("not stopped: running"). Every
// process of runc's container is then killed, and the delete retried for
// up to 10 s.
func (s *Sandbox) deleteTask(ctx context.Context) error {
	var errs []error
	if err := s.killTask(ctx); err != nil {
		errs = append(errs, err)
	}
	// A restore killed with the daemon leaves the unit's root bound on
	// runc's criu-root: runc could not remove its state.
	if err := unmountUnder(filepath.Join(s.c.cfg.RuncRoot, s.c.cfg.Namespace, s.id)); err != nil {
		errs = append(errs, err)
	}
	_, err := s.task.Delete(ctx)
	if err != nil && !errdefs.IsNotFound(err) {
		s.c.log.Warn("the task's delete was refused; killing every process of its container", "id", s.id, "err", err)
		if kerr := s.task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); kerr != nil && !errdefs.IsNotFound(kerr) {
			s.c.log.Debug("kill of every process refused", "id", s.id, "err", kerr)
		}
		for deadline := time.Now().Add(10 * time.Second); err != nil && !errdefs.IsNotFound(err) && time.Now().Before(deadline); {
			select {
			case <-ctx.Done():
				return errors.Join(append(errs, ctx.Err())...)
			case <-time.After(50 * time.Millisecond):
			}
			_, err = s.task.Delete(ctx)
		}
	}
	if err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete task: %w", err))
	}
	return errors.Join(errs...)
}

// killTask kills every process of the task, unless it has already stopped,
// and waits for the exit.
func (s *Sandbox) killTask(ctx context.Context) error {
	// A CRIU left holding the unit (a daemon that died in a park) would
	// keep it from dying.
	killed, err := s.c.killHelpers(s.c.cfg.Namespace, s.id, 0)
	if err != nil {
		return fmt.Errorf("killing CRIU: %w", err)
	}
	st, err := s.task.Status(ctx)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("task status: %w", err)
	}
	switch st.Status {
	case containerd.Stopped:
		return nil
	case containerd.Created:
		if s.task.Pid() == 0 {
			// No process: a restore that never finished (the shim's
			// process gets its pid once runc restore returns), or a
			// start cut short. No exit will come, and containerd
			// deletes a created task without a pid as it is. What the
			// restore made of the unit is among the helpers just
			// killed (waiting here held a restarted daemon up 10-30 s
			// in e2e).
			s.c.log.Debug("created task has no process; deleting it as it is", "id", s.id, "killed", len(killed))
			return nil
		}
		// Never started. A task only created (a warm sandbox, Create)
		// has runc's init waiting to run the unit: it is killed, and
		// its exit waited for, before the task can be deleted. One
		// whose init killHelpers just killed (a descendant of the shim,
		// it is among them) refuses the kill: runc says "process
		// already finished", but the shim may not have seen the exit
		// yet, and the delete refuses a task still created (seen in
		// e2e under load: the warm sandbox of a drained run left
		// behind), so its stop is waited for.
		if err := s.task.Kill(ctx, syscall.SIGKILL); err != nil {
			s.c.log.Debug("created task refused the kill; deleting it as it is", "id", s.id, "err", err, "killed", len(killed))
			if len(killed) > 0 {
				return s.waitStopped(ctx)
			}
			return nil
		}
		if err := s.waitExit(ctx); err != nil {
			return err
		}
		return s.waitStopped(ctx)
	}
	if err := s.task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("kill: %w", err)
	}
	if st.Status == containerd.Paused || st.Status == containerd.Pausing {
		// A frozen process acts on SIGKILL only once thawed.
		_ = s.task.Resume(ctx)
	}
	return s.waitExit(ctx)
}

// waitStopped waits, for up to 10 s, until a killed task that was only
// created is stopped: its exit may reach a client watching it (a Remove
// after containerd restarted) before the shim has recorded it, and the
// delete refuses a task not stopped.
func (s *Sandbox) waitStopped(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := s.task.Status(ctx)
		if err != nil || st.Status != containerd.Created || time.Now().After(deadline) {
			return nil // the delete says what is wrong, if anything
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitExit waits for the exit of a task just killed.
func (s *Sandbox) waitExit(ctx context.Context) error {
	if s.exited == nil {
		return nil // create failed before it could watch; Delete reaps
	}
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-s.exited:
	case <-t.C:
		return fmt.Errorf("kill: the task did not exit within 30 s")
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (s *Sandbox) closeFiles() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeFilesLocked()
}

func (s *Sandbox) closeFilesLocked() {
	for _, f := range s.files {
		f.Close()
	}
	s.files = nil
}

// Remove removes sandbox id in whatever state it is — its task killed
// (thawed first if frozen) and deleted, its container, snapshot, network
// namespace and CRIU work files — without reattaching its output, as for
// a sandbox whose run is closed or unknown. A sandbox that is not there is
// not an error.
func (c *Client) Remove(ctx context.Context, id string) error {
	ctx = c.ctx(ctx)
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		c.lazyPids(id).KillLeftovers() // no container, no unit
		err = errors.Join(c.removeRuncLeftover(id), removeNetns(c.netnsPath(id)), removeTree(c.criu.Of(id)), c.removeGrants(id), removeFile(c.gateFIFO(id)))
		if err != nil {
			return fmt.Errorf("executor: remove %s: %w", id, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("executor: remove %s: %w", id, err)
	}
	s := &Sandbox{c: c, id: id, cont: cont}
	if task, err := cont.Task(ctx, nil); err == nil {
		s.task = task
		if exit, err := task.Wait(c.ctx(context.WithoutCancel(ctx))); err == nil {
			s.watch(exit)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("executor: remove %s: %w", id, err)
	}
	return s.Destroy(ctx)
}

// removeRuncLeftover removes what a runc create or restore of sandbox id
// that died before writing its state (its process killed with the
// daemon's) left in runc's root: a directory without state.json, the
// root file system maybe still bound on its criu-root. runc takes it for
// a container of that id and refuses every later restore. Call it once
// id's container is gone; runc's own state (state.json) is runc's.
func (c *Client) removeRuncLeftover(id string) error {
	dir := filepath.Join(c.cfg.RuncRoot, c.cfg.Namespace, id)
	if _, err := os.Lstat(filepath.Join(dir, "state.json")); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := removeTree(dir); err != nil {
		return fmt.Errorf("runc's leftover of %s: %w", id, err)
	}
	return nil
}

// Prune removes what sandboxes that are gone left of the executor's own
// state: pinned network namespaces, CRIU work directories and link
// FIFOs (link.go) of ids containerd has no container for. It returns
// those ids.
func (c *Client) Prune(ctx context.Context) ([]string, error) {
	ids, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, id := range ids {
		have[id] = true
	}
	var pruned []string
	var errs []error
	netns := filepath.Join(c.cfg.StateDir, "netns")
	for _, dir := range []string{netns, c.criu.Root(), filepath.Join(c.cfg.StateDir, "grants"), filepath.Join(c.cfg.StateDir, "gate"), filepath.Join(c.cfg.StateDir, "link")} {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		for _, e := range ents {
			id := e.Name()
			if have[id] || id == ".empty" {
				continue
			}
			p := filepath.Join(dir, id)
			if dir == netns {
				err = removeNetns(p)
				pruned = append(pruned, id)
			} else {
				err = removeTree(p)
			}
			errs = append(errs, err)
		}
	}
	return pruned, errors.Join(errs...)
}

// removeFile removes the file at p, if there is one.
func removeFile(p string) error {
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
