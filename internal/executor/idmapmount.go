//go:build linux

package executor

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/idmap"
)

// rangeUserns is a user namespace mapping ids 0..idmap.Size-1 to r, as an
// open file of it: an idmapped mount's map. A child in a new user
// namespace with those maps (sleep, from PATH) is made, its namespace
// opened, and the child ended.
func rangeUserns(r idmap.Range) (*os.File, error) {
	maps := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(r.Base), Size: idmap.Size}}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: maps, GidMappings: maps,
		Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("a user namespace of range %d: %w", r.Base, err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("a user namespace of range %d: %w", r.Base, err)
	}
	return f, nil
}

// idmappedBind mounts src on dst (which exists, of src's kind) through
// the user namespace userns: what src's filesystem holds as id n is seen
// there as the host id that userns maps n to.
func idmappedBind(src, dst string, userns *os.File) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return &os.PathError{Op: "open_tree", Path: src, Err: err}
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return &os.PathError{Op: "mount_setattr idmap", Path: src, Err: err}
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return &os.PathError{Op: "move_mount", Path: dst, Err: err}
	}
	return nil
}
