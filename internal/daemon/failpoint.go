package daemon

import (
	"os"
	"syscall"

	"github.com/runrecordd/runrecordd/internal/member"
)

// FailpointEnv names the environment variable that arms one failpoint: the
// daemon kills itself with SIGKILL when it reaches the named step. The
// crash tests (test/e2e) arm each step of a park, a resume and a close in
// turn and check what the next start finds. Unset, failpoints cost one
// string comparison.
const FailpointEnv = "RUNRECORDD_FAILPOINT"

// Failpoints are the steps that can be armed, in the order an operation
// reaches them.
var Failpoints = []string{
	"start.sandboxed",   // the unit's sandbox started, the run's genesis not stored
	"park.checkpointed", // images ingested (or transcript sealed), nothing recorded
	"park.attested",     // evidence sealed, segments not appended
	"park.appended",     // Executed + Suspended durable, sandbox not destroyed
	"resume.restored",   // sandbox restored or started, Resumed not appended
	"resume.appended",   // Resumed durable
	"close.appended",    // Executed + Closed durable, sandbox not destroyed
}

// MigrationFailpoints are the steps of a migration between two hosts of
// a fleet (member.MigrationFailpoints).
var MigrationFailpoints = member.MigrationFailpoints

var armed = os.Getenv(FailpointEnv)

// failpoint dies here if the step is armed.
func failpoint(step string) {
	if armed == step {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// reach marks a step of an operation: a failpoint armed for it fires, and
// a unit test's seam (Daemon.seam) runs there — a test of the daemon's
// refusal branches makes the store refuse at exactly that step.
func (d *Daemon) reach(step string) {
	failpoint(step)
	if d.seam != nil {
		d.seam(step)
	}
}
