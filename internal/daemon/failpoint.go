package daemon

import "github.com/runrecordd/runrecordd/internal/failpoint"

// The crash tests' failpoints (internal/failpoint): FailpointEnv arms one
// of Failpoints (a run's, a park's, a resume's, a close's steps) or
// MigrationFailpoints (a migration's, the source's then the target's).
const FailpointEnv = failpoint.Env

var (
	Failpoints          = failpoint.Steps
	MigrationFailpoints = failpoint.MigrationSteps
)

// reach marks a step of an operation: a failpoint armed for it fires, and
// a unit test's seam (Daemon.seam) runs there — a test of the daemon's
// refusal branches makes the store refuse at exactly that step.
func (d *Daemon) reach(step string) {
	failpoint.Fire(step)
	if d.seam != nil {
		d.seam(step)
	}
}
