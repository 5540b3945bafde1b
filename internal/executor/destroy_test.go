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
// that died, made processes killTask did not see: the shim says created
// with no pid throughout, and runc refuses the delete until every
// process of the container is killed.
type restoringTask struct {
	containerd.Task
	killedAll bool
	deletes   int
}

func (t *restoringTask) Pid() uint32 { return 0 }

func (t *restoringTask) Status(context.Context) (containerd.Status, error) {
	return containerd.Status{Status: containerd.Created}, nil
}

func (t *restoringTask) Kill(_ context.Context, _ syscall.Signal, opts ...containerd.KillOpts) error {
	var ki containerd.KillInfo
	for _, o := range opts {
		if err := o(context.Background(), &ki); err != nil {
			return err
		}
	}
	t.killedAll = t.killedAll || ki.All
	return nil
}

func (t *restoringTask) Delete(context.Context, ...containerd.ProcessDeleteOpts) (*containerd.ExitStatus, error) {
	t.deletes++
	if !t.killedAll {
		return nil, errors.New("runc did not terminate successfully: cannot delete container restoring that is not stopped: running")
	}
	return nil, nil
}

// TestDeleteTaskKillsARestoresProcesses: a task created with no pid whose
// delete runc refuses (processes a left restore made) has every process
// of its container killed, and is deleted.
func TestDeleteTaskKillsARestoresProcesses(t *testing.T) {
	task := &restoringTask{}
	s := &Sandbox{
		c:    &Client{cfg: Config{Namespace: "runrecordd-test-none", RuncRoot: t.TempDir()}, log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		id:   "restoring",
		task: task,
	}
	if err := s.deleteTask(context.Background()); err != nil {
		t.Fatalf("deleteTask: %v", err)
	}
	if !task.killedAll || task.deletes != 2 {
		t.Errorf("killed all %v, %d deletes; want every process killed, then the delete", task.killedAll, task.deletes)
	}
}
