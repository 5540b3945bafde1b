package executor

import "errors"

// Errors. Every error the package returns names the operation and the
// sandbox or image, and wraps one of these where one applies, or the
// containerd error (test those with github.com/containerd/errdefs).
var (
	// ErrMissing is a host without what the executor needs: no containerd
	// binary, no runc, no CRIU, or a CRIU whose `criu check` fails.
	ErrMissing = errors.New("executor: missing host dependency")
	// ErrExists is an id (sandbox, daemon socket) already in use.
	ErrExists = errors.New("executor: already exists")
	// ErrNotFound is an image or sandbox that is not there.
	ErrNotFound = errors.New("executor: not found")
	// ErrImageMismatch is an image whose manifest digest is not the one the
	// spec names.
	ErrImageMismatch = errors.New("executor: image digest mismatch")
	// ErrInvalid is a spec, checkpoint location or argument that cannot be
	// used.
	ErrInvalid = errors.New("executor: invalid argument")
	// ErrCheckpoint is a checkpoint that did not complete; the sandbox's task
	// is then still running (CRIU thaws it), and the message carries the
	// tail of CRIU's dump log.
	ErrCheckpoint = errors.New("executor: checkpoint failed")
	// ErrRestore is a restore that did not complete; nothing of the new
	// sandbox is left behind, and the message carries the tail of CRIU's
	// restore log.
	ErrRestore = errors.New("executor: restore failed")
	// ErrCheckpointTimeout is a checkpoint whose deadline passed: CRIU was
	// killed, the task was thawed and goes on as it was.
	ErrCheckpointTimeout = errors.New("executor: checkpoint deadline passed")
	// ErrRestoreTimeout is a restore whose deadline passed: CRIU and
	// whatever it had restored were killed, and nothing of the new sandbox
	// is left behind.
	ErrRestoreTimeout = errors.New("executor: restore deadline passed")
	// ErrTooLarge is something a unit made that is over its limit: a rw
	// layer over its budget. A checkpoint refused for it wraps
	// ErrCheckpoint too, and leaves the task as it was.
	ErrTooLarge = errors.New("executor: over a limit")
	// ErrExited is a sandbox whose task has exited where it was expected
	// to be alive.
	ErrExited = errors.New("executor: the task has exited")
)
