// Package failpoint is the crash tests' kill switch: the steps of the
// daemon's operations where it can be killed, by name and in the order an
// operation reaches them, and the environment variable that arms one
// (test/e2e arms each in turn and checks what the next start finds). It
// imports nothing of the daemon, so the crash tests name the steps without
// it.
package failpoint

import (
	"os"
	"strings"
	"syscall"
)

// Env names the environment variable that arms failpoints, comma
// separated: the daemon kills itself with SIGKILL when it reaches an armed
// step, and takes the failure path of an armed fault (Fails). Unset,
// failpoints cost one map lookup.
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

// PostCopySteps are the steps of a post-copy migration's target
// (test/e2e's TestFleetPostCopySourceDown arms the first,
// TestFleetPostCopyCrash the others).
var PostCopySteps = []string{
	"receive.owing",    // target: claimed, owing slabs, not answered, none fetched
	"postcopy.adopted", // target: a slab adopted, not settled (still owed)
	"postcopy.told",    // target: every slab settled, the source told, the owing not ended
}

// LazySteps are the steps of a lazy resume (serve --lazy-resume) inside
// the executor, in order (test/e2e's TestLazyCrashAtEachStep arms each).
var LazySteps = []string{
	"lazy.restored", // the unit runs, its sandbox's criu.conf still says lazy-pages
}

// LostSteps are the steps of a lazy restore's pages lost (a page server
// killed, say) that can be armed: test/e2e's TestLazyFaults kills the
// page server with the daemon armed at each.
var LostSteps = []string{
	"lazy.lost", // the unit frozen (or destroyed), lazy-pages ended, nothing journaled
}

// SettledSteps are the steps of a lazy restore's every page resident
// that can be armed: test/e2e's TestLazyCrashSettled arms each.
var SettledSteps = []string{
	"lazy.resident", // lazy-pages exited cleanly, the unit settled, nothing journaled
}

// Faults are failures that can be armed beside a step: where one is
// armed, the code takes its failure path (Fails) and goes on.
var Faults = []string{
	"lazy.freeze",   // the freeze of a unit whose lazy pages were lost fails
	"postcopy.fill", // a post-copy target's background fetch fails at once, as if its source were gone
}

var armed = parse(os.Getenv(Env))

func parse(env string) map[string]bool {
	m := map[string]bool{}
	for _, s := range strings.Split(env, ",") {
		if s != "" {
			m[s] = true
		}
	}
	return m
}

// Fire kills this process here if step is armed.
func Fire(step string) {
	if armed[step] {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// Fails reports whether fault (one of Faults) is armed.
func Fails(fault string) bool { return armed[fault] }
