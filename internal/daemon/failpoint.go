package daemon

import "github.com/runrecordd/runrecordd/internal/failpoint"

// reach marks a step of an operation: a failpoint armed for it fires, and
// a unit test's seam (Daemon.seam) runs there — a test of the daemon's
// refusal branches makes the store refuse at exactly that step.
func (d *Daemon) reach(step string) {
	failpoint.Fire(step)
	if d.seam != nil {
		d.seam(step)
	}
}
