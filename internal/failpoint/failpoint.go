// Package failpoint is the crash tests' kill switch: the steps of the
// daemon's operations where it can be killed, by name and in the order an
// operation reaches them, and the environment variable that arms one
// (test/e2e arms each in turn and checks what the next start finds). It
// imports nothing of the daemon, so the crash tests name the steps without
// it.
package failpoint

import (
	"os"
	"syscall"
)

// Env names the environment variable that arms one failpoint: the daemon
// kills itself with SIGKILL when it reaches the named step. Unset,
// failpoints cost one string comparison.
const Env = "RUNRECORDD_FAILPOINT"

// Steps are the steps of a run, a park, a resume and a close that can be
// armed, in the order an operation reaches them.
var Steps = []string{
	"start.sandboxed",   // the unit's sandbox started, the run's genesis not stored
	"park.checkpointed", // images ingested (or transcript sealed), nothing recorded
	"park.attested",     // evidence sealed, segments not appended
	"park.appended",     // Executed + Suspended durable, sandbox not destroyed
	"resume.restored",   // sandbox restored or started, Resumed not appended
	"resume.appended",   // Resumed durable
	"close.appended",    // Executed + Closed durable, sandbox not destroyed
}

// MigrationSteps are the steps of a migration between two hosts of
// a fleet, in order: the source's, then the target's (test/e2e's
// TestFleetMigrateCrash arms each).
var MigrationSteps = []string{
	"migrate.transferred", // source: transferred in etcd, not handed off in its store
	"migrate.handedoff",   // source: handed off in both, the target not asked
	"receive.fetched",     // target: record and objects here, nothing stored
	"receive.imported",    // target: run stored (parked), not claimed in etcd
	"receive.claimed",     // target: claimed in etcd, not resumed
}

// LazySteps are the steps of a lazy resume (serve --lazy-resume) inside
// the executor, in order (test/e2e's TestLazyCrashAtEachStep arms each).
var LazySteps = []string{
	"lazy.restored", // the unit runs, its sandbox's criu.conf still says lazy-pages
}

var armed = os.Getenv(Env)

// Fire kills this process here if step is armed.
func Fire(step string) {
	if armed == step {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
