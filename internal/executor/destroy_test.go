//go:build linux

package executor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"syscall"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
)

// restoringTask is a task whose restore, left in the shim by a daemon
// that died, completes between killTask's look (created, no process) and
// the delete: the delete is refused as runc refuses a running container.
type restoringTask struct {
	containerd.Task
	running bool
	kills   int
	deleted bool
}

func (t *restoringTask) Pid() uint32 {
	if t.running {
		return 4242
	}
	return 0
}

func (t *restoringTask) Status(context.Context) (containerd.Status, error) {
	if t.running && t.kills == 0 {
		return containerd.Status{Status: containerd.Running}, nil
	}
	if t.running {
		return containerd.Status{Status: containerd.Stopped}, nil
	}
	return containerd.Status{Status: containerd.Created}, nil
}

func (t *restoringTask) Kill(context.Context, syscall.Signal, ...containerd.KillOpts) error {
	t.kills++
	return nil
}

func (t *restoringTask) Delete(context.Context, ...containerd.ProcessDeleteOpts) (*containerd.ExitStatus, error) {
	if !t.running {
		t.running = true // the restore completed meanwhile
		return nil, errors.New("runc did not terminate successfully: cannot delete container restoring that is not stopped: running")
	}
	if t.kills == 0 {
		return nil, errors.New("cannot delete container restoring that is not stopped: running")
	}
	t.deleted = true
	return nil, nil
}

// TestDeleteTaskKillsARestoreThatCompleted: a task that had no process
// when it was killed, and is running when the delete is refused, is
// killed again and deleted.
func TestDeleteTaskKillsARestoreThatCompleted(t *testing.T) {
	task := &restoringTask{}
	s := &Sandbox{
		c:    &Client{cfg: Config{Namespace: "runrecordd-test-none", RuncRoot: t.TempDir()}, log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		id:   "restoring",
		task: task,
	}
	if err := s.deleteTask(context.Background()); err != nil {
		t.Fatalf("deleteTask: %v", err)
	}
	if task.kills != 1 || !task.deleted {
		t.Errorf("kills %d, deleted %v; want the running task killed once and deleted", task.kills, task.deleted)
	}
}
